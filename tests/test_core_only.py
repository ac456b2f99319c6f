"""A core-only install (no `runtime` extra) runs the `up` path of an SGLang topology: with Pillow,
torch and the other runtime packages made unimportable, every module `up` reaches imports, the
topology validates and renders, and the post-launch canary builds and scores its request."""

from __future__ import annotations

import io
import random
import subprocess
import sys
from pathlib import Path

from PIL import Image

from epdctl import shapes

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("PIL", "torch", "transformers", "tokenizers", "safetensors", "numpy", "zmq", "aiohttp")

SCRIPT = r'''
import contextlib, importlib.abc, io, json, random, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BLOCKED = %(blocked)r

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: core-only install)")
        return None

sys.meta_path.insert(0, Block())

from epdctl.cli import main
import epdctl.commands.cluster, epdctl.commands.canary, epdctl.commands.preflight_gate
import epdctl.launchers.local, epdctl.launchers.ssh, epdctl.launchers.slurm.launcher, epdctl.orchestrate.lifecycle
import epdctl.canary, epdctl.canary.pairs, epdctl.rebalance.links, epdctl.shapes
from epdctl import shapes
from epdctl.canary import run_canary

for args in (["validate", "topologies/qwen2vl-epd.yaml"], ["render", "topologies/qwen2vl-epd.yaml", "--node", "p0"],
             ["render", "topologies/deepseek-v3-pp4-ep32.yaml", "--launcher", "slurm"]):
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            main(args)
    except SystemExit as e:
        assert e.code in (0, None), (args, e.code)

SEED = 7
expected = shapes.answer_for(shapes.make_request(random.Random(SEED), 3, plain=True)[2])

class Router(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, doc):
        body = json.dumps(doc).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "qwen2-vl-7b", "object": "model"}]})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        images = [c for c in req["messages"][0]["content"] if c["type"] == "image_url"]
        assert len(images) == 3 and images[0]["image_url"]["url"].startswith("data:image/png;base64,")
        self._send({"id": "x", "object": "chat.completion", "model": req["model"],
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": expected},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 9, "total_tokens": 19}})

srv = ThreadingHTTPServer(("127.0.0.1", 0), Router)
threading.Thread(target=srv.serve_forever, daemon=True).start()
res = run_canary(f"http://127.0.0.1:{srv.server_port}", n_images=3, seed=SEED)
assert res.correct and res.named == 3, res
srv.shutdown()
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not loaded, loaded
print("CORE-ONLY OK")
'''


def test_up_path_without_pillow_or_torch() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT % {"blocked": BLOCKED}], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                                       "HOME": str(ROOT)})
    assert proc.returncode == 0 and "CORE-ONLY OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_packaged_plain_pictures_are_the_drawn_ones() -> None:
    for colour in shapes.COLOURS:
        for shape in shapes.SHAPES:
            packaged = Image.open(io.BytesIO(shapes.plain_png(shape, colour)))
            assert packaged.mode == "RGB" and packaged.tobytes() == shapes.draw(shape, colour).tobytes(), (colour, shape)


def test_plain_requests_draw_the_rng_like_random_item() -> None:
    items = shapes.make_request(random.Random(11), 5, plain=True)[2]
    rng = random.Random(11)
    assert items == [shapes.random_item(rng, plain=True)[1] for _ in range(5)]
