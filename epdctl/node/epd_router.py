"""``python -m epdctl.node.epd_router``: the E→P→D router epdctl runs in front of vLLM workers.

vLLM's encoder, prefill and decode servers are plain OpenAI servers; the sequence is the caller's
job (vLLM's examples/online_serving/disaggregated_encoder proxy): send each image of a request to
an encoder alone (it computes the embedding and its EC connector stores it), then the whole
request to a prefill with ``max_tokens: 1`` (it reads the embeddings, computes the KV cache and
its KV connector stores it), then the request to a decode (it reads the KV cache and generates),
whose answer, streamed or not, is the client's. smg 1.13 cannot do this: its EPD mode refuses
HTTP workers (``EPD mode requires gRPC connection_mode and TokenSpeed``). No prefill: the request
goes to the decode (a colocated worker) after the encoders.

The admin surface is smg's, as epdctl reads it (epdctl/http/routerctl.py): ``GET /health``,
``GET /readiness`` (one healthy worker of each role it routes to), ``GET /workers``,
``POST /workers {url, worker_type}`` (encode, prefill, decode: a worker joins or changes role without
a router restart), ``DELETE /workers/{id}``; workers are health-checked every second and leave
rotation after two failed checks. A deleted worker leaves rotation at once and stays listed as
``draining`` until the requests the router sent it have come back, so a caller that waits for it
to leave ``GET /workers`` knows the router has nothing in flight on it. ``--prometheus-port`` serves request counters.
With ``--api-key`` every call but the health checks needs ``Authorization: Bearer KEY``.
Standard library only: it runs on the router's node, where epdctl is installed.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TYPES = {"encode": "encode", "prefill": "prefill", "decode": "decode", "regular": "decode"}
MEDIA = ("image_url", "input_audio", "audio_url", "video_url", "image", "video")
KV_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
             "remote_block_ids": None, "remote_host": None, "remote_port": None}


class Worker:
    def __init__(self, wid: str, url: str, kind: str):
        self.id, self.url, self.kind = wid, url.rstrip("/"), kind
        self.healthy, self.failures, self.load, self.draining = False, 0, 0, False

    def doc(self) -> dict[str, Any]:
        status = "draining" if self.draining else "ready" if self.healthy else "not_ready"
        return {"id": self.id, "url": self.url, "worker_type": self.kind, "is_healthy": self.healthy,
                "status": status, "load": self.load, "connection_mode": "http", "runtime_type": "vllm"}


class Pool:
    """The workers by role, their health, least-loaded round-robin picks (per role) and counters."""

    def __init__(self, failure_threshold: int = 2):
        self.lock = threading.Lock()
        self.workers: dict[str, Worker] = {}
        self.ids = itertools.count(1)
        self.turns: dict[str, itertools.count[int]] = {}
        self.failure_threshold = failure_threshold
        self.counters: dict[str, int] = {}

    def add(self, url: str, kind: str) -> Worker:
        """Register ``url`` as ``kind``; the same URL already listed in that role is kept, in
        another role (or draining) it is replaced."""
        with self.lock:
            for w in list(self.workers.values()):
                if w.url == url.rstrip("/"):
                    if w.kind == kind and not w.draining:
                        return w
                    del self.workers[w.id]
            w = Worker(f"{kind}-{next(self.ids)}", url, kind)
            self.workers[w.id] = w
            return w

    def remove(self, wid: str) -> bool:
        """Out of rotation now; unlisted once nothing the router sent it is in flight."""
        with self.lock:
            w = self.workers.get(wid)
            if w is None:
                return False
            w.draining = True
            if w.load == 0:
                del self.workers[wid]
            return True

    def of(self, kind: str, healthy: bool = True) -> list[Worker]:
        """``healthy``: the workers a request may go to; else every listed one."""
        with self.lock:
            return [w for w in self.workers.values()
                    if w.kind == kind and (not healthy or (w.healthy and not w.draining))]

    def take(self, kind: str) -> Worker:
        """The least-loaded routable worker of ``kind`` (round-robin among equals), its load
        counted before the lock is let go (a removal cannot miss the request)."""
        with self.lock:
            ready = sorted((w for w in self.workers.values() if w.kind == kind and w.healthy and not w.draining),
                           key=lambda w: w.load)
            if not ready:
                raise Unavailable(f"no healthy {kind} worker")
            least = [w for w in ready if w.load == ready[0].load]
            w = least[next(self.turns.setdefault(kind, itertools.count())) % len(least)]
            w.load += 1
            return w

    def release(self, w: Worker) -> None:
        with self.lock:
            w.load -= 1
            if w.draining and w.load == 0:
                self.workers.pop(w.id, None)

    def count(self, name: str) -> None:
        with self.lock:
            self.counters[name] = self.counters.get(name, 0) + 1

    def check(self, timeout: float) -> None:
        with self.lock:
            workers = list(self.workers.values())
        for w in workers:
            status, _ = call("GET", w.url + "/health", None, timeout)
            ok = status == 200
            w.failures = 0 if ok else w.failures + 1
            w.healthy = ok or (w.healthy and w.failures < self.failure_threshold)


class Unavailable(Exception):
    pass


def call(method: str, url: str, body: bytes | None, timeout: float,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One request; (0, error text) when the worker cannot be reached."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=timeout)
    try:
        conn.request(method, u.path or "/", body=body, headers={"Content-Type": "application/json",
                                                                 **(headers or {})})
        r = conn.getresponse()
        return r.status, r.read()
    except (OSError, http.client.HTTPException) as e:
        return 0, str(e).encode()
    finally:
        conn.close()


def media_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every image/audio/video part of a chat request's messages, in order."""
    out = []
    for msg in body.get("messages") or []:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            out += [p for p in content if isinstance(p, dict) and p.get("type") in MEDIA]
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "Router"

    def log_message(self, fmt: str, *args: Any) -> None:  # one line per routed request instead
        pass

    def _send(self, status: int, doc: Any, ctype: str = "application/json") -> None:
        data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": {"message": message, "type": "router_error", "code": status}})

    def _authorized(self) -> bool:
        key = self.server.api_key
        if key is None or self.path in ("/health", "/liveness", "/readiness"):
            return True
        if self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self._error(401, "missing or wrong API key")
        return False

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if not self._authorized():
            return
        pool = self.server.pool
        if self.path in ("/health", "/liveness"):
            self._send(200, {"status": "ok"})
        elif self.path == "/readiness":
            missing = [k for k in self.server.needs if not pool.of(k)]
            self._send(503 if missing else 200, {"status": "not_ready" if missing else "ready",
                                                 "missing": missing})
        elif self.path == "/workers":
            workers = [w.doc() for w in pool.of("encode", False) + pool.of("prefill", False) + pool.of("decode", False)]
            stats = {f"{k}_count": len(pool.of(k, False)) for k in ("encode", "prefill", "decode")}
            self._send(200, {"workers": workers, "total": len(workers), "stats": stats})
        elif self.path == "/v1/models":
            try:
                w = pool.take("decode")
            except Unavailable as e:
                return self._error(503, str(e))
            try:
                status, data = call("GET", w.url + "/v1/models", None, 10)
            finally:
                pool.release(w)
            self._send(status or 502, data)
        else:
            self._error(404, f"no route for GET {self.path}")

    def do_DELETE(self) -> None:  # noqa: N802
        if not self._authorized():
            return
        wid = self.path.rsplit("/", 1)[-1]
        if self.path.startswith("/workers/") and self.server.pool.remove(wid):
            self._send(202, {"status": "accepted", "worker_id": wid})
        else:
            self._error(404, f"no worker {wid}")

    def do_POST(self) -> None:  # noqa: N802
        if not self._authorized():
            return
        raw = self._body()
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return self._error(400, "the body is not JSON")
        if self.path == "/workers":
            kind = TYPES.get(str(body.get("worker_type", "")))
            if kind is None or not isinstance(body.get("url"), str):
                return self._error(400, "a worker needs url and worker_type (encode, prefill, decode)")
            w = self.server.pool.add(body["url"], kind)
            self._send(202, {"status": "accepted", "worker_id": w.id})
        elif self.path in ("/v1/chat/completions", "/v1/completions"):
            self._route(body)
        else:
            self._error(404, f"no route for POST {self.path}")

    def _route(self, body: dict[str, Any]) -> None:
        pool, t0 = self.server.pool, time.monotonic()
        try:
            items = media_items(body)
            if items:
                self._encode(body, items)
            t_e = time.monotonic()
            if pool.of("prefill", False):
                params = self._prefill(body)
                if params:
                    body = {**body, "kv_transfer_params": params}
            t_p = time.monotonic()
            decode = pool.take("decode")
        except Unavailable as e:
            pool.count("failed")
            return self._error(503, str(e))
        except Failed as e:
            pool.count("failed")
            return self._error(502, str(e))
        self._relay(decode, body)
        pool.count("routed")
        sys.stderr.write(f"routed {len(items)} item(s): encode {t_e - t0:.3f}s prefill {t_p - t_e:.3f}s "
                         f"decode {time.monotonic() - t_p:.3f}s via {decode.url}\n")

    def _stage(self, kind: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        w = self.server.pool.take(kind)
        try:
            status, data = call("POST", w.url + path, json.dumps(body).encode(), self.server.request_timeout)
        finally:
            self.server.pool.release(w)
        if status != 200:
            raise Failed(f"{kind} {w.url} answered {status or 'nothing'}: {data[:300].decode(errors='replace')}")
        doc = json.loads(data)
        return doc if isinstance(doc, dict) else {}

    def _encode(self, body: dict[str, Any], items: list[dict[str, Any]]) -> None:
        def one(item: dict[str, Any]) -> None:
            self._stage("encode", "/v1/chat/completions", {
                "model": body.get("model"), "messages": [{"role": "user", "content": [item]}],
                "max_tokens": 1, "stream": False})
        with ThreadPoolExecutor(max_workers=min(8, len(items))) as ex:
            list(ex.map(one, items))

    def _prefill(self, body: dict[str, Any]) -> dict[str, Any] | None:
        req = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": KV_PARAMS}
        req.pop("stream_options", None)
        if "max_completion_tokens" in req:
            req["max_completion_tokens"] = 1
        params = self._stage("prefill", self.path, req).get("kv_transfer_params")
        return params if isinstance(params, dict) else None

    def _relay(self, w: Worker, body: dict[str, Any]) -> None:
        """The decode's answer to the client as it comes (chunked when the decode streams);
        ``w`` was taken (its load counted) by the caller and is released here."""
        u = urllib.parse.urlsplit(w.url)
        conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=self.server.request_timeout)
        try:
            conn.request("POST", self.path, body=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            self.send_response(r.status)
            self.send_header("Content-Type", r.getheader("Content-Type", "application/json"))
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                chunk = r.read1(65536)
                if not chunk:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (OSError, http.client.HTTPException) as e:
            self.server.pool.count("failed")
            self.close_connection = True
            sys.stderr.write(f"decode {w.url} failed: {e}\n")
        finally:
            self.server.pool.release(w)
            conn.close()


class Failed(Exception):
    pass


class Router(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], pool: Pool, needs: list[str], api_key: str | None, timeout: float):
        super().__init__(addr, Handler)
        self.pool, self.needs, self.api_key, self.request_timeout = pool, needs, api_key, timeout


class MetricsHandler(BaseHTTPRequestHandler):
    server: "MetricsServer"

    def log_message(self, fmt: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        pool = self.server.pool
        lines = [f'epd_router_requests_total{{outcome="{k}"}} {v}' for k, v in sorted(pool.counters.items())]
        lines += [f'epd_router_worker_healthy{{url="{w.url}",worker_type="{w.kind}"}} {int(w.healthy)}'
                  for w in pool.of("encode", False) + pool.of("prefill", False) + pool.of("decode", False)]
        data = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class MetricsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], pool: Pool):
        super().__init__(addr, MetricsHandler)
        self.pool = pool


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="epd_router", description=__doc__.split("\n\n")[0])
    ap.add_argument("--encode", action="append", default=[], metavar="URL")
    ap.add_argument("--prefill", action="append", default=[], metavar="URL")
    ap.add_argument("--decode", action="append", default=[], metavar="URL")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prometheus-host")
    ap.add_argument("--prometheus-port", type=int)
    ap.add_argument("--api-key")
    ap.add_argument("--health-check-interval-secs", type=float, default=1.0)
    ap.add_argument("--health-failure-threshold", type=int, default=2)
    ap.add_argument("--health-check-timeout-secs", type=float, default=5.0)
    ap.add_argument("--request-timeout-secs", type=float, default=600.0)
    a = ap.parse_args(argv)
    pool = Pool(a.health_failure_threshold)
    for kind, urls in (("encode", a.encode), ("prefill", a.prefill), ("decode", a.decode)):
        for url in urls:
            pool.add(url, kind)
    needs = [k for k, urls in (("encode", a.encode), ("prefill", a.prefill), ("decode", a.decode)) if urls]
    server = Router((a.host, a.port), pool, needs or ["decode"], a.api_key, a.request_timeout_secs)
    if a.prometheus_port:
        metrics = MetricsServer((a.prometheus_host or a.host, a.prometheus_port), pool)
        threading.Thread(target=metrics.serve_forever, daemon=True).start()

    def watch() -> None:
        while True:
            pool.check(timeout=a.health_check_timeout_secs)
            time.sleep(a.health_check_interval_secs)
    threading.Thread(target=watch, daemon=True).start()
    sys.stderr.write(f"epd_router on {a.host}:{a.port}: encode {a.encode} prefill {a.prefill} decode {a.decode}\n")
    sys.stderr.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
