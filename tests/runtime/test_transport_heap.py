"""The heap thresholds the zmq transport fixes: the memory of one received message's frames
serves the next (counted in minor page faults over real tcp sockets, not timed), and a
transport's start applies them."""

from __future__ import annotations

import asyncio
import ctypes.util
import os
import subprocess
import sys
import pytest

from epdctl.runtime.fast.transports import heap
from epdctl.runtime.transports import open_transport

glibc = pytest.mark.skipif("libc" not in (ctypes.util.find_library("c") or ""), reason="glibc hosts only")

# 16 MiB as eight 2 MiB messages over tcp (a KV hand-off's parts), each batch held until the next
# arrives, as a receiver holds a message's views: minor page faults per 16 MiB
RECEIVE = """
import importlib.util, resource, sys, zmq, numpy as np
spec = importlib.util.spec_from_file_location("heap", sys.argv[2])  # (the module alone: no torch import)
heap = importlib.util.module_from_spec(spec); spec.loader.exec_module(heap)
if sys.argv[1] == "keep":
    assert heap.keep_frames()
def faults(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
ctx = zmq.Context(); a = ctx.socket(zmq.PUSH); b = ctx.socket(zmq.PULL)
a.connect(f"tcp://127.0.0.1:{b.bind_to_random_port('tcp://127.0.0.1')}")
buf = np.ones(2 << 20, np.uint8)
def run(k):
    f0, held = faults(), []
    for _ in range(k):
        for _ in range(8): a.send(buf, copy=False)
        held = [b.recv(copy=False) for _ in range(8)]
    return (faults() - f0) / k
run(3)
print(run(10))
"""


def faults_per_16mib(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", RECEIVE, mode, heap.__file__], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.strip())


@glibc
def test_received_frames_reuse_memory_once_the_thresholds_are_fixed():
    kept, default = faults_per_16mib("keep"), faults_per_16mib("default")
    pages = (16 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert kept < pages / 50  # measured 0.15 per 16 MiB here
    assert default > pages / 4  # glibc's defaults map fresh pages for the parts (measured ~1,980 of 4,096)


def test_a_started_transport_has_fixed_them(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(heap, "keep_frames", lambda: calls.append(1) or True)

    async def go():
        t = open_transport("zmq", "127.0.0.1", timeout=2, shm=True)
        await t.start()
        await t.close()
    asyncio.run(go())
    assert calls == [1]
