"""A runtime worker process for the split-pipeline tests: one role (encoder, prefill or decode)
with all three transports open, driven over a multiprocessing connection by the test process.

Usage: python split_worker.py ROLE CKPT LISTENER_ADDRESS AUTHKEY_HEX TCP_PORT MOONCAKE_PORT
"""

from __future__ import annotations

import asyncio
import pickle
import sys
import traceback
from multiprocessing.connection import Client

from epdctl.runtime.decode_engine import DecodeEngine
from epdctl.runtime.encoder_engine import VisionEncoder
from epdctl.runtime.errors import TransferError
from epdctl.runtime.model import load_bundle
from epdctl.runtime.prefill_engine import LanguagePrefill
from epdctl.runtime.prompt import build_prompt
from epdctl.runtime.sampling import SamplingParams
from epdctl.runtime.transports import open_transport
from epdctl.runtime.wire import embeds_to_tensors, kv_to_tensors, tensors_to_embeds, tensors_to_prefill_result


async def serve(role: str, ckpt: str, address: str, authkey: bytes, tcp_port: int, mc_port: int) -> None:
    bundle = load_bundle(ckpt, role=role)
    transports = {"zmq": open_transport("zmq", "127.0.0.1", port=tcp_port, timeout=10),
                  "zmq-ipc": open_transport("zmq-ipc", "127.0.0.1", timeout=10),
                  "mooncake": open_transport("mooncake", "127.0.0.1", port=mc_port, timeout=10)}
    for t in transports.values():
        await t.start()
    encoder = VisionEncoder(bundle) if role == "encoder" else None
    prefill = LanguagePrefill(bundle) if role == "prefill" else None
    decode = DecodeEngine(bundle, keep_logits=True) if role == "decode" else None
    conn = Client(address, authkey=authkey)
    # plain pickle: multiprocessing's own pickler would share tensors through file descriptors
    send = lambda obj: conn.send_bytes(pickle.dumps(obj))  # noqa: E731
    send({"addresses": {k: t.address for k, t in transports.items()}})
    try:
        while True:
            cmd = pickle.loads(await asyncio.to_thread(conn.recv_bytes))
            if cmd["op"] == "quit":
                break
            try:
                reply = await handle(cmd, transports, encoder, prefill, decode, bundle)
            except TransferError as exc:
                reply = {"transfer_error": str(exc)}
            except Exception:
                reply = {"error": traceback.format_exc()}
            send(reply)
    finally:
        for t in transports.values():
            await t.close()
        conn.close()


async def handle(cmd, transports, encoder, prefill, decode, bundle) -> dict:
    op, tr = cmd["op"], transports.get(cmd.get("transport", "zmq"))
    if op == "encode":
        images = encoder.encode(cmd["images"])
        meta, tensors = embeds_to_tensors(images)
        nbytes = await tr.send(cmd["reply_to"], cmd["key"], meta, tensors)
        return {"cached": [e.cached for e in images], "nbytes": nbytes, "stats": encoder.stats}
    if op == "prefill":
        images = tensors_to_embeds(*await tr.recv(cmd["key"], 30))
        prompt = build_prompt(bundle, cmd["messages"], [e.grid_thw for e in images])
        result = prefill.prefill(prompt, images, SamplingParams.from_dict(cmd["sampling"]))
        nbytes = await tr.send(cmd["reply_to"], cmd["room"], *kv_to_tensors(result))
        return {"input_ids": prompt.input_ids, "first_token": result.first_token, "kv_bytes": nbytes,
                "embeds": [e.embeds for e in images]}
    if op == "decode":
        for room, sampling in zip(cmd["rooms"], cmd["samplings"]):
            result = tensors_to_prefill_result(*await tr.recv(room, 30))
            decode.add(room, result, SamplingParams.from_dict(sampling))
        tokens: dict[str, list[int]] = {r: [] for r in cmd["rooms"]}
        batch_sizes = []
        while decode.num_running:
            out = decode.step()
            batch_sizes.append(len({room for room, _, _ in out}))  # rows stepped (a new row emits two tokens)
            for room, token, _ in out:
                tokens[room].append(token)
        return {"tokens": tokens, "logits": {r: decode.pop_logits(r) for r in cmd["rooms"]},
                "batch_sizes": batch_sizes}
    if op == "recv":
        meta, tensors = await tr.recv(cmd["key"], cmd.get("timeout", 10))
        return {"meta": meta, "tensors": tensors}
    if op == "stats":
        return {"transports": {k: dict(t.stats) for k, t in transports.items()},
                "encoder": encoder.stats if encoder else None}
    raise ValueError(f"unknown op {op!r}")


if __name__ == "__main__":
    role, ckpt, address, authkey, tcp_port, mc_port = sys.argv[1:7]
    asyncio.run(serve(role, ckpt, address, bytes.fromhex(authkey), int(tcp_port), int(mc_port)))
