"""Encoder -> prefill -> decode across three real worker processes, over ZMQ (tcp, ipc) and
Mooncake, must give exactly the tokens (and, within float noise, the logits) of one-process
``generate()``. Worker processes start once for the module.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import sys
import uuid
from multiprocessing.connection import Listener
from pathlib import Path

import pytest
import torch

from tiny_model import image_messages, reference_generate

from epdctl.runtime.errors import TransferError
from epdctl.runtime.transports import open_transport
from epdctl.runtime.wire import pack

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("split_worker.py")
PORTS = {"encoder": (33100, 33101), "prefill": (33110, 33111), "decode": (33120, 33121)}
TRANSPORTS = ["zmq", "zmq-ipc", "mooncake"]
MAX_TOKENS = 12
LOGIT_TOL = 1e-4


class Worker:
    def __init__(self, role: str, ckpt: Path, log_dir: Path):
        self.role = role
        authkey = os.urandom(16)
        self.listener = Listener(str(log_dir / f"{role}.ctl"), family="AF_UNIX", authkey=authkey)
        self.log_path = log_dir / f"{role}.log"
        self.log = open(self.log_path, "w")
        env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), role, str(ckpt), self.listener.address, authkey.hex(), *map(str, PORTS[role])],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
        self.conn = None
        self.addresses: dict[str, str] = {}

    def accept(self) -> None:
        self.conn = self.listener.accept()
        self.addresses = pickle.loads(self.conn.recv_bytes())["addresses"]

    def send(self, op: str, **kw) -> None:
        self.conn.send_bytes(pickle.dumps({"op": op, **kw}))

    def reply(self) -> dict:
        if not self.conn.poll(120):
            raise AssertionError(f"{self.role} worker did not answer; log:\n{self.log_path.read_text()[-3000:]}")
        out = pickle.loads(self.conn.recv_bytes())
        assert "error" not in out, f"{self.role} worker failed:\n{out['error']}"
        return out

    def call(self, op: str, **kw) -> dict:
        self.send(op, **kw)
        return self.reply()

    def stop(self) -> None:
        try:
            if self.conn is not None:
                self.conn.send_bytes(pickle.dumps({"op": "quit"}))
            self.proc.wait(timeout=20)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        finally:
            self.listener.close()
            self.log.close()


@pytest.fixture(scope="module")
def workers(tiny_ckpt, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("split-workers")
    started = {role: Worker(role, tiny_ckpt, log_dir) for role in PORTS}
    try:
        for w in started.values():
            w.accept()
        yield started
    finally:
        for w in started.values():
            w.stop()


def run_pipeline(workers, transport: str, images: list[bytes], messages: list[dict], rooms: list[str],
                 sampling: dict | None = None) -> dict:
    """One request per room (same images), encoded, prefilled and then decoded in one batch."""
    enc, pre, dec = workers["encoder"], workers["prefill"], workers["decode"]
    sampling = sampling or {"max_tokens": MAX_TOKENS}
    prefills = []
    for room in rooms:
        key = uuid.uuid4().hex
        enc.send("encode", transport=transport, key=key, reply_to=pre.addresses[transport], images=images)
        pre.send("prefill", transport=transport, key=key, messages=messages, room=room,
                 reply_to=dec.addresses[transport], sampling=sampling)
        enc.reply()
        prefills.append(pre.reply())
    out = dec.call("decode", transport=transport, rooms=rooms, samplings=[sampling] * len(rooms))
    out["prefills"] = prefills
    return out


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("n_images", [1, 3, 8])
def test_split_matches_one_process_generate(workers, bundle, images, transport, n_images):
    imgs = images[:n_images]
    messages = image_messages(n_images)
    ref_ids, ref_tokens, ref_logits = reference_generate(bundle, imgs, messages, MAX_TOKENS)
    room = f"{transport}-{n_images}-{uuid.uuid4().hex[:6]}"
    out = run_pipeline(workers, transport, imgs, messages, [room])
    assert out["prefills"][0]["input_ids"] == ref_ids
    assert out["tokens"][room] == ref_tokens
    logits = out["logits"][room]
    assert len(logits) == len(ref_logits)
    diff = max(float((a - b).abs().max()) for a, b in zip(logits, ref_logits))
    assert diff < LOGIT_TOL, f"logits drift {diff} over {transport}"


def test_decode_batches_requests_of_different_lengths(workers, bundle, images):
    """Three requests with 1, 4 and 8 images decoded in one batch equal each one alone."""
    cases = [(images[:1], "describe the image"), (images[2:6], "count the images"), (images[:8], "what colour")]
    rooms = [f"batch-{i}-{uuid.uuid4().hex[:6]}" for i in range(len(cases))]
    enc, pre, dec = workers["encoder"], workers["prefill"], workers["decode"]
    sampling = {"max_tokens": MAX_TOKENS, "stop_token_ids": []}
    for room, (imgs, text) in zip(rooms, cases):
        key = uuid.uuid4().hex
        enc.send("encode", key=key, reply_to=pre.addresses["zmq"], images=imgs)
        pre.send("prefill", key=key, messages=image_messages(len(imgs), text), room=room,
                 reply_to=dec.addresses["zmq"], sampling=sampling)
        enc.reply()
        pre.reply()
    out = dec.call("decode", rooms=rooms, samplings=[sampling] * len(rooms))
    assert max(out["batch_sizes"]) == len(rooms)  # they really were stepped together
    for room, (imgs, text) in zip(rooms, cases):
        _, ref_tokens, ref_logits = reference_generate(bundle, imgs, image_messages(len(imgs), text), MAX_TOKENS)
        assert out["tokens"][room] == ref_tokens
        diff = max(float((a - b).abs().max()) for a, b in zip(out["logits"][room], ref_logits))
        assert diff < LOGIT_TOL


def test_encoder_cache_hit_gives_identical_result(workers, images):
    """The same images again: served from the encoder's cache, same tokens as the first time."""
    messages = image_messages(2)
    first = run_pipeline(workers, "zmq", images[8:10], messages, [f"c1-{uuid.uuid4().hex[:6]}"])
    second = run_pipeline(workers, "zmq", images[8:10], messages, [f"c2-{uuid.uuid4().hex[:6]}"])
    assert list(first["tokens"].values()) == list(second["tokens"].values())
    for a, b in zip(first["prefills"][0]["embeds"], second["prefills"][0]["embeds"]):
        assert torch.equal(a, b)
    stats = workers["encoder"].call("stats")["encoder"]
    assert stats["cache_hits"] >= 2


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("damage", ["corrupt", "truncated"])
def test_damaged_transfer_to_another_process_raises(workers, transport, damage):
    """A damaged payload sent from this process to the decode worker: both ends see TransferError."""
    port = {"zmq": 33130, "zmq-ipc": 0, "mooncake": 33131}[transport]
    frames = pack({"kind": "test"}, {"kv": torch.randn(64, 128), "tail": torch.arange(7)})
    body = bytearray(frames[1])
    if damage == "corrupt":
        body[1000] ^= 0x10
    else:
        body = body[: len(body) // 2]
    damaged = [frames[0], bytes(body), frames[2]]
    key = f"damaged-{transport}-{damage}-{uuid.uuid4().hex[:6]}"
    dec = workers["decode"]

    async def go() -> str:
        sender = open_transport(transport, "127.0.0.1", port=port, timeout=10)
        await sender.start()
        try:
            with pytest.raises(TransferError) as info:
                await sender.send_frames(dec.addresses[transport], key, damaged)
            return str(info.value)
        finally:
            await sender.close()

    message = asyncio.run(go())
    assert ("checksum" in message) if damage == "corrupt" else ("truncated" in message)
    out = dec.call("recv", transport=transport, key=key, timeout=10)
    assert "transfer_error" in out and ("checksum" in out["transfer_error"] or "truncated" in out["transfer_error"])


def test_seeded_sampling_across_processes_equals_one_process(workers, bundle, images):
    """Token i is drawn with seed (seed, i), so a split deployment samples what one process does."""
    from epdctl.runtime.decode_engine import DecodeEngine
    from epdctl.runtime.encoder_engine import VisionEncoder
    from epdctl.runtime.prefill_engine import LanguagePrefill
    from epdctl.runtime.prompt import build_prompt
    from epdctl.runtime.sampling import SamplingParams

    sampling = {"max_tokens": MAX_TOKENS, "temperature": 1.2, "top_p": 0.9, "seed": 1234}
    messages = image_messages(3)
    room = f"sampled-{uuid.uuid4().hex[:6]}"
    out = run_pipeline(workers, "mooncake", images[:3], messages, [room], sampling)
    params = SamplingParams.from_dict(sampling)
    encoded = VisionEncoder(bundle).encode(images[:3])
    result = LanguagePrefill(bundle).prefill(build_prompt(bundle, messages, [e.grid_thw for e in encoded]),
                                             encoded, params)
    engine = DecodeEngine(bundle)
    engine.add("local", result, params)
    local = []
    while engine.num_running:
        local += [t for _, t, _ in engine.step()]
    assert out["tokens"][room] == local
    _, greedy, _ = reference_generate(bundle, images[:3], messages, MAX_TOKENS)
    assert local != greedy  # it really sampled
