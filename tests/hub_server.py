"""A local Hugging Face hub for tests: serves folders as model repositories in the hub's HTTP API
layout, so the real ``huggingface_hub`` client (pointed at it with ``HF_ENDPOINT``) downloads
from it exactly as from huggingface.co, and logs every request.

The endpoints and headers are the ones huggingface_hub 2.4.0 calls and reads (its source:
github.com/huggingface/huggingface_hub, src/huggingface_hub/hf_api.py ``repo_info`` ->
``GET /api/models/{repo}/revision/{rev}`` read into ``ModelInfo`` (``id``, ``sha``,
``siblings``), ``_iter_repo_tree_pages`` -> ``GET /api/models/{repo}/tree/{rev}?recursive=..``
(a JSON list of ``{type, path, size, oid}``, one page when no ``Link: rel=next`` header),
file_download.py ``get_hf_file_metadata`` -> ``HEAD /{repo}/resolve/{rev}/{file}`` reading
``X-Repo-Commit``, ``ETag`` (or ``X-Linked-Etag``) and ``Content-Length`` (or ``X-Linked-Size``),
then ``GET`` of the same URL for the bytes). An unknown repository answers 401 with
``X-Error-Code: RepoNotFound`` and an unknown revision 404 with ``X-Error-Code:
RevisionNotFound``, as the hub does (utils/_http.py ``hf_raise_for_status``).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    folder: Path
    commit: str
    files: dict[str, Path] = field(default_factory=dict)
    oids: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, folder: Path) -> "Repo":
        files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
        oids = {}
        for rel, p in files.items():
            data = p.read_bytes()
            oids[rel] = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id
        commit = hashlib.sha1(json.dumps(oids, sort_keys=True).encode()).hexdigest()
        return cls(folder, commit, files, oids)


class HubServer:
    """``repos``: repo id -> folder. ``requests`` lists (method, path) as served."""

    def __init__(self, repos: dict[str, Path], host: str = "127.0.0.1", port: int = 0):
        self.repos = {rid: Repo.of(Path(f)) for rid, f in repos.items()}
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer((host, port), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "HubServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def fetched(self, repo: str) -> dict[str, int]:
        """File -> how many times its bytes were served (GET of a resolve URL)."""
        out: dict[str, int] = {}
        prefix = f"/{repo}/resolve/"
        with self._lock:
            for method, path in self.requests:
                if method == "GET" and path.startswith(prefix):
                    name = path[len(prefix):].split("/", 1)[1]
                    out[name] = out.get(name, 0) + 1
        return out

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: object) -> None:
                return None

            def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None,
                      head: bool = False) -> None:
                self.send_response(code)
                for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
                    self.send_header(k, v)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _error(self, code: int, kind: str, message: str, head: bool) -> None:
                body = json.dumps({"error": message}).encode()
                self._send(code, body, {"Content-Type": "application/json", "X-Error-Code": kind,
                                        "X-Error-Message": message}, head)

            def _repo(self, rid: str, rev: str, head: bool) -> Repo | None:
                repo = hub.repos.get(rid)
                if repo is None:
                    self._error(401, "RepoNotFound", "Repository not found", head)
                    return None
                if rev not in ("main", repo.commit):
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
                    return None
                return repo

            def do_HEAD(self) -> None:
                self._serve(head=True)

            def do_GET(self) -> None:
                self._serve(head=False)

            def _serve(self, head: bool) -> None:
                path = unquote(urlsplit(self.path).path)
                with hub._lock:
                    hub.requests.append((self.command, path))
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                    rid, kind, rev = f"{parts[2]}/{parts[3]}", parts[4], "/".join(parts[5:])
                    repo = self._repo(rid, rev, head)
                    if repo is None:
                        return
                    if kind == "revision":
                        doc: object = {"id": rid, "modelId": rid, "sha": repo.commit, "private": False,
                                       "siblings": [{"rfilename": f} for f in repo.files]}
                    else:
                        doc = [{"type": "file", "path": f, "size": p.stat().st_size, "oid": repo.oids[f]}
                               for f, p in repo.files.items()]
                    self._send(200, json.dumps(doc).encode(), {"Content-Type": "application/json"}, head)
                    return
                if len(parts) >= 5 and parts[2] == "resolve":
                    rid, rev, name = f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:])
                    repo = self._repo(rid, rev, head)
                    if repo is None:
                        return
                    if name not in repo.files:
                        self._send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit},
                                   head)
                        return
                    data = repo.files[name].read_bytes()
                    self._send(200, data, {"X-Repo-Commit": repo.commit, "ETag": f'"{repo.oids[name]}"',
                                           "Content-Length": str(len(data)),
                                           "Content-Type": "application/octet-stream"}, head)
                    return
                self._send(404, b"not found")

        return Handler
