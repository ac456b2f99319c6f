"""A switchable worker changes role in place: same process, same port, answers still right.

Real processes: a normal encoder E0, a prefill P, a normal decode D and a switchable worker S
that starts as an encoder. S is moved encoder -> decode -> encoder through
``POST /admin/switch_role`` with the role's own command line; after each switch a real request
through it gives the reference tokens, and its counters continue. S has a fixed
``--transfer-port`` (as epdctl renders one from the topology's range): every role it takes
re-opens its transport on that same port.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from pathlib import Path

import aiohttp
import pytest

from conftest import image_messages, reference_generate
from tiny_model import make_image
from worker_procs import Worker, chat_body, metric, pd_call, pick_model, start_all, with_room

E0, S, P, PB, PEB, D = 33700, 33701, 33710, 33711, 33712, 33720
ST = 33705  # S's transfer port, kept across switches
MODEL = "tiny-vlm"


@pytest.fixture(scope="module")
def model_dir(tiny_ckpt, tmp_path_factory) -> Path:
    return pick_model(tmp_path_factory.mktemp("model"), tiny_ckpt)


def _argv(role: str, model_dir: Path, port: int) -> list[str]:
    m = ["--model-path", str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--transfer-port", str(ST)]
    if role == "encoder":
        return ["encoder", *m]
    return [role, *m, "--served-model-name", MODEL, "--kv-timeout", "60"]


@pytest.fixture(scope="module")
def cluster(model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    m = ["--model-path", str(model_dir)]
    workers = {
        "e0": Worker("encoder", [*m, "--port", str(E0)], logs, "encoder0"),
        "s": Worker("encoder", [*m, "--port", str(S), "--transfer-port", str(ST), "--switchable"], logs, "switchable"),
        "p": Worker("prefill", [*m, "--served-model-name", MODEL, "--port", str(P), "--bootstrap-port", str(PB),
                                "--encoder-bootstrap-port", str(PEB), "--encoder-urls", f"http://127.0.0.1:{E0}",
                                f"http://127.0.0.1:{S}", "--encoder-probe-interval", "0.5", "--kv-timeout", "60"],
                    logs),
        "d": Worker("decode", [*m, "--served-model-name", MODEL, "--port", str(D), "--kv-timeout", "60"], logs),
    }
    start_all(list(workers.values()))
    yield workers
    for w in workers.values():
        w.stop()


async def _call(method: str, url: str, body: dict | None = None) -> tuple[int, dict | str]:
    async with aiohttp.ClientSession() as s, s.request(method, url, json=body) as r:
        text = await r.text()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text


def call(method: str, url: str, body: dict | None = None) -> tuple[int, dict | str]:
    return asyncio.run(_call(method, url, body))


def answer(decode_port: int, png: bytes) -> list[int]:
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    body = chat_body(MODEL, [url], max_tokens=8, return_token_ids=True)
    (ps, pb), (ds, db) = asyncio.run(pd_call(f"http://127.0.0.1:{P}", f"http://127.0.0.1:{decode_port}",
                                             with_room(body, PB)))
    assert ps == 200, pb
    assert ds == 200, db
    return json.loads(db)["choices"][0]["token_ids"]


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def expected(bundle, png: bytes) -> list[int]:
    return reference_generate(bundle, [png], image_messages(1, "describe the image"), 8)[1]


def encoder_requests(port: int) -> float:
    status, text = call("GET", f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    return metric(str(text), "epd_encoder_requests_total")


def test_encoder_to_decode_and_back_in_place(cluster, model_dir):
    s = cluster["s"]
    pid = s.proc.pid
    pngs = [make_image(i) for i in range(3)]
    from epdctl.runtime.model import load_bundle
    bundle = load_bundle(str(model_dir), role="colocated")
    want = [expected(bundle, p) for p in pngs]
    reg = f"http://127.0.0.1:{PEB}"
    # as an encoder: only S in the registry, so S encodes the image
    assert call("DELETE", reg + "/unregister_encoder_url", {"url": f"http://127.0.0.1:{E0}"})[0] == 200
    assert answer(D, pngs[0]) == want[0]
    served = encoder_requests(S)
    assert served >= 1
    assert listening(ST)

    # drained (out of the registry, idle), then switched: same pid, same port, decode routes
    assert call("POST", reg + "/register_encoder_url", {"url": f"http://127.0.0.1:{E0}"})[0] == 200
    assert call("DELETE", reg + "/unregister_encoder_url", {"url": f"http://127.0.0.1:{S}"})[0] == 200
    status, doc = call("POST", f"http://127.0.0.1:{S}/admin/switch_role", {"argv": _argv("decode", model_dir, S)})
    assert status == 200, doc
    assert doc["old_role"] == "encoder" and doc["new_role"] == "decode" and doc["pid"] == pid
    assert call("GET", f"http://127.0.0.1:{S}/server_info")[1]["disaggregation_mode"] == "decode"
    assert call("POST", f"http://127.0.0.1:{S}/encode", {})[0] == 404      # the encoder's route is gone
    assert answer(S, pngs[1]) == want[1]                                    # S decodes, E0 encodes
    assert listening(ST)                                                    # its new transport, same port

    # a switch must keep the address: another port is refused and nothing changes
    status, doc = call("POST", f"http://127.0.0.1:{S}/admin/switch_role",
                       {"argv": _argv("encoder", model_dir, S + 50)})
    assert status == 400 and "restart it instead" in doc["error"]["message"]
    assert call("GET", f"http://127.0.0.1:{S}/server_info")[1]["disaggregation_mode"] == "decode"

    # back to encoder: counters continue from before the first switch
    status, doc = call("POST", f"http://127.0.0.1:{S}/admin/switch_role", {"argv": _argv("encoder", model_dir, S)})
    assert status == 200 and doc["pid"] == pid, doc
    assert encoder_requests(S) == served
    assert call("POST", reg + "/register_encoder_url", {"url": f"http://127.0.0.1:{S}"})[0] == 200
    assert call("DELETE", reg + "/unregister_encoder_url", {"url": f"http://127.0.0.1:{E0}"})[0] == 200
    assert answer(D, pngs[2]) == want[2]
    assert encoder_requests(S) == served + 1
    assert listening(ST)
    status, text = call("GET", f"http://127.0.0.1:{S}/metrics")
    assert metric(str(text), "epd_worker_role_switches_total") == 2
    assert 'epd_worker_role_info{role="encoder"} 1' in str(text)
    assert s.proc.poll() is None and s.proc.pid == pid
