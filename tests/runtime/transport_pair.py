"""Two real transports of one kind in one process, and the tensors the transport tests send."""

from __future__ import annotations

import asyncio

import torch

from epdctl.runtime.transports import open_transport

KINDS = ["zmq", "zmq-ipc", "mooncake"]
PORTS = {"zmq": (33200, 33201), "zmq-ipc": (0, 0), "mooncake": (33210, 33211)}
UNREACHABLE = {"zmq": "zmq+tcp://127.0.0.1:33299", "zmq-ipc": "zmq+ipc:///tmp/epd-nobody-listens.sock",
               "mooncake": "mooncake://127.0.0.1:33298"}


def sample_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"f32": torch.randn(33, 17, generator=g), "bf16": torch.randn(5, 8, generator=g).bfloat16(),
            "f16": torch.randn(9, generator=g).half(), "i64": torch.arange(-5, 6), "u8": torch.arange(200).byte(),
            "empty": torch.empty(0, 4), "scalar": torch.tensor(3.5),
            "noncontig": torch.randn(6, 4, generator=g).t()}


def assert_same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]), k


def with_pair(kind: str, fn, timeout: float = 5.0, shm: bool = True):
    async def go():
        pa, pb = PORTS[kind]
        a = open_transport(kind, "127.0.0.1", port=pa, timeout=timeout, shm=shm)
        b = open_transport(kind, "127.0.0.1", port=pb, timeout=timeout, shm=shm)
        await a.start()
        await b.start()
        try:
            return await fn(a, b)
        finally:
            await a.close()
            await b.close()
    return asyncio.run(go())
