"""A stand-in SGLang-style worker for control-plane tests: real HTTP, canned answers.

Serves what smg and epdctl probe (`/health`, `/server_info`, `/v1/models`, `/v1/loads`) and
answers `POST /v1/chat/completions` with a fixed completion plus a `timings` object, the way
the embedded decode worker does. Usage: python dummy_worker.py PORT ROLE [--bootstrap-port B]
[--fail-health-file F] [--exit-at-start MSG] [--router-unhealthy-for S] (the first S seconds,
a /health probe that is not epdctl's, i.e. smg's, gets 503: a worker the router has not taken yet)
[--load-seconds S] (before it listens, S seconds of an engine's loading lines: checkpoint shards
as SGLang and vLLM print them, then CUDA graph capture) [--exit-during-load S] (exit 1 after S
seconds of loading, the way an engine dies of an out-of-memory error) [--zero-tokens] (answer
with an empty completion: 0 generated tokens, what a run missing nvidia_peermem returns)
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ANSWER = "Picture 1: red circle\nPicture 2: blue square\nPicture 3: green triangle"


SHARDS = 163


def _load(seconds: float, exit_after: float | None) -> None:
    """An engine's start: shard loading as a tqdm bar written to a file (carriage returns,
    SGLang's and vLLM's own format), then CUDA graph capture; or death part way."""
    start = time.monotonic()
    print("[2025-10-16 09:06:10 TP0] Load weight begin. avail mem=137.34 GB", flush=True)
    shard = 0
    while True:
        spent = time.monotonic() - start
        if exit_after is not None and spent >= exit_after:
            print("\n[2025-10-16 09:06:40 TP0] Scheduler hit an exception: torch.OutOfMemoryError: "
                  "CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
            sys.exit(1)
        if spent >= seconds * 0.9 and exit_after is None:
            break
        shard = min(SHARDS, int(SHARDS * spent / max(seconds * 0.9, 1e-9)) + 1)
        sys.stderr.write(f"\rLoading safetensors checkpoint shards: {100 * shard // SHARDS:3d}% Completed | "
                         f"{shard}/{SHARDS} [00:{int(spent):02d}<00:00,  1.00it/s]")
        sys.stderr.flush()
        time.sleep(0.5)
    print(f"\n[2025-10-16 09:06:22 TP0] Capture cuda graph begin. This can take up to several minutes. "
          f"avail mem=11.82 GB", flush=True)
    time.sleep(max(0.0, seconds - (time.monotonic() - start)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("role")
    ap.add_argument("--bootstrap-port", type=int)
    ap.add_argument("--fail-health-file")
    ap.add_argument("--exit-at-start")
    ap.add_argument("--router-unhealthy-for", type=float, default=0.0)
    ap.add_argument("--load-seconds", type=float, default=0.0)
    ap.add_argument("--exit-during-load", type=float)
    ap.add_argument("--zero-tokens", action="store_true")
    args = ap.parse_args()
    t0 = time.monotonic()
    print(f"dummy {args.role} starting on {args.port}", flush=True)
    if args.exit_at_start:
        sys.exit(f"error: {args.exit_at_start}")
    if args.load_seconds or args.exit_during_load is not None:
        _load(args.load_seconds, args.exit_during_load)
    if args.bootstrap_port:  # smg TCP-probes the prefill's bootstrap port
        boot = socket.socket()
        boot.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        boot.bind(("127.0.0.1", args.bootstrap_port))
        boot.listen(16)
        threading.Thread(target=lambda: [boot.accept()[0].close() for _ in iter(int, 1)],
                         daemon=True).start()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def _send(self, code: int, doc: object) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                bad = args.fail_health_file and Path(args.fail_health_file).exists()
                ours = "Python-urllib" in (self.headers.get("User-Agent") or "")  # epdctl's probe
                bad = bad or (not ours and time.monotonic() - t0 < args.router_unhealthy_for)
                return self._send(503 if bad else 200, {})
            if self.path == "/server_info":
                return self._send(200, {"model_path": "dummy", "served_model_name": "dummy",
                                        "disaggregation_mode": args.role})
            if self.path == "/v1/models":
                return self._send(200, {"object": "list",
                                        "data": [{"id": "dummy", "object": "model"}]})
            if self.path.startswith("/v1/loads"):
                return self._send(200, {"timestamp": "", "dp_rank_count": 1, "loads": [
                    {"dp_rank": 0, "num_running_reqs": 1, "num_waiting_reqs": 2,
                     "token_usage": 0.25}]})
            self._send(404, {"error": "not found"})

        def _stream(self, content: str, n: int) -> None:
            """Server-sent events as SGLang streams them: a role chunk, the text word by word,
            a finish chunk with usage, [DONE]."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            base = {"id": "chatcmpl-dummy", "object": "chat.completion.chunk", "model": "dummy"}
            words = content.split(" ") if content else []
            deltas = [{"role": "assistant", "content": ""}] + [
                {"content": w + (" " if k < len(words) - 1 else "")} for k, w in enumerate(words)]
            for delta in deltas:
                chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            end = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}}
            self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            req = json.loads(self.rfile.read(n) or b"{}")
            print(f"POST {self.path} room={req.get('bootstrap_room')}", flush=True)
            content, n = ("", 0) if args.zero_tokens else (ANSWER, 5)
            if req.get("stream"):
                return self._stream(content, n)
            self._send(200, {
                "id": "chatcmpl-dummy", "object": "chat.completion", "model": "dummy",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n},
                "timings": {"encode_ms": 1.0, "prefill_ms": 2.0, "decode_ms": 3.0},
            })

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"dummy {args.role} ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
