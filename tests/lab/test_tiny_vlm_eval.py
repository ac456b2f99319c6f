"""lab/model/eval_tiny_vlm.py --split-seeds: the served accuracy figure without starting a cluster.

The canary's own code (epdctl.canary.request.measure_accuracy) sends its requests over real HTTP
to a small OpenAI-style server here that answers with one-process greedy generation of the
images it received. The offline evaluation must draw byte-identical requests, with the same
token limit, and so report the same figure.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "tiny-qwen2vl"

from eval_tiny_vlm import SPLIT_SEED, evaluate_split_seeds, split_requests  # noqa: E402
from tiny_vlm_common import answer, load  # noqa: E402

from epdctl.canary.request import measure_accuracy  # noqa: E402


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    torch.set_num_threads(1)
    ld = load(MODEL)
    seen: list[dict[str, Any]] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, doc: dict[str, Any]) -> None:
            body = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._send({"object": "list", "data": [{"id": "tiny-qwen2vl", "object": "model"}]})

        def do_POST(self) -> None:
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            parts = req["messages"][0]["content"]
            pngs = [base64.b64decode(p["image_url"]["url"].split(",", 1)[1])
                    for p in parts if p["type"] == "image_url"]
            question = next(p["text"] for p in parts if p["type"] == "text")
            with lock:
                text = answer(ld, pngs, question, max_new_tokens=req["max_tokens"])
                seen.append({"pngs": pngs, "question": question, "max_tokens": req["max_tokens"]})
            self._send({"choices": [{"index": 0, "message": {"role": "assistant",
                                                              "content": text}}]})

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("n, plain", [(1, False), (8, False), (8, True)])
def test_offline_figure_is_the_canary_figure(server: tuple[str, list[dict[str, Any]]], n: int,
                                             plain: bool) -> None:
    url, seen = server
    seen.clear()
    requests = 2
    served = measure_accuracy(url, n_images=n, requests=requests,
                              seed=SPLIT_SEED + 10_000 * n + plain, plain=plain)
    offline = evaluate_split_seeds(MODEL, requests=requests, counts=(n,))
    assert offline[f"{n}_image{'_plain' if plain else '_varied'}"] == round(served.per_image, 4)
    drawn = list(split_requests(n, plain, requests))
    assert sorted(s["pngs"] for s in seen) == sorted(pngs for pngs, _, _ in drawn)
    assert {s["question"] for s in seen} == {q for _, q, _ in drawn}
    assert {s["max_tokens"] for s in seen} == {12 * n + 8}
