"""An SGLang-shaped HTTP server for the role-switch API (no GPU here).

Follows SGLang 0.5.23's own source, as installed in the venv:
- ``sglang/srt/entrypoints/http_server.py``: ``POST /pd_role_switch`` (``AuthLevel.ADMIN_OPTIONAL``:
  ``Authorization: Bearer <api key>`` when a key is set) answers ``PdRoleSwitchReqOutput`` with
  200 when ``success`` else 400; ``GET /server_info`` carries ``internal_states``.
- ``sglang/srt/managers/io_struct.py``: ``PdRoleSwitchReqInput{new_role: "prefill"|"decode"|"",
  decode_cuda_graph_bs, decode_cuda_graph_memory_gb, prepare_only}``, output ``{success, message,
  old_role, new_role, safe_to_restore}``.
- ``sglang/srt/disaggregation/role_switch.py``: the rejection table (flag off, bad role, not in
  PD mode), "instance is not idle; drain all requests before switching", a flip to decode that
  would capture graphs needs ``decode_cuda_graph_memory_gb``; "already in target role".
- ``sglang/srt/managers/scheduler_components/internal_state.py``: ``decode_cuda_graph_memory_gb``
  in each internal state.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FIELDS = {"new_role", "decode_cuda_graph_bs", "decode_cuda_graph_memory_gb", "prepare_only", "rid",
          "http_worker_ipc"}


class FakeSGLang:
    def __init__(self, role: str, *, enabled: bool = True, api_key: str | None = None,
                 graph_gb: float = 1.25, graphs_captured: bool = False, host: str = "127.0.0.1",
                 port: int = 0):
        self.role, self.enabled, self.api_key = role, enabled, api_key
        self.graph_gb, self.graphs_captured = graph_gb, graphs_captured
        self.running = 0
        self.paused = False
        self.calls: list[tuple[str, str, Any]] = []
        self.server = ThreadingHTTPServer((host, port), self._handler())
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def switch(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        new = str(body.get("new_role") or "").lower()

        def out(ok: bool, msg: str, safe: bool = False) -> tuple[int, dict[str, Any]]:
            return (200 if ok else 400), {"success": ok, "message": msg, "old_role": self.role,
                                          "new_role": new, "safe_to_restore": safe}
        if not self.enabled:
            return out(False, "--enable-pd-role-switch is not set on this server", True)
        if new not in ("prefill", "decode"):
            return out(False, f"invalid new_role={new!r}", True)
        if new == self.role:
            return out(True, "already in target role")
        if self.running:
            return out(False, "instance is not idle; drain all requests before switching", True)
        if new == "decode" and not self.graphs_captured and body.get("decode_cuda_graph_memory_gb") is None:
            return out(False, "decode_cuda_graph_memory_gb is required before capturing decode graphs", True)
        if body.get("prepare_only"):
            return out(True, "ready", True)
        old, self.role = self.role, new
        return 200, {"success": True, "message": "ok", "old_role": old, "new_role": new, "safe_to_restore": False}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, status: int, doc: Any) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                fake.calls.append(("GET", self.path, None))
                if self.path == "/server_info":
                    self._send(200, {"disaggregation_mode": fake.role, "version": "0.5.23",
                                     "internal_states": [{"disaggregation_mode": fake.role,
                                                          "decode_cuda_graph_bs": [1, 2, 4, 8],
                                                          "decode_cuda_graph_memory_gb": fake.graph_gb}]})
                elif self.path.startswith("/v1/loads"):
                    self._send(200, {"timestamp": "", "dp_rank_count": 1, "loads": [
                        {"dp_rank": 0, "num_running_reqs": fake.running, "num_waiting_reqs": 0}]})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                fake.calls.append(("POST", self.path, body))
                if fake.api_key and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    self._send(401, {"error": "Unauthorized"})
                elif self.path == "/pd_role_switch":
                    extra = set(body) - FIELDS
                    if extra:
                        self._send(422, {"detail": f"unknown fields {sorted(extra)}"})
                    else:
                        self._send(*fake.switch(body))
                elif self.path in ("/pause_generation", "/continue_generation"):
                    fake.paused = self.path == "/pause_generation"
                    self._send(200, {"message": "Generation paused." if fake.paused else "Generation continued."})
                else:
                    self._send(404, {"detail": "Not Found"})

        return H
