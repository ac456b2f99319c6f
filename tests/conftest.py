"""What every test shares: the import path of the helper modules, set once here, and the tiny random
Qwen2-VL checkpoint fixtures (built offline once per test run, only when a test asks for them).

Helper modules are imported by their plain names (``from sshd_nodes import SshdNodes``,
``import bench_decode_batch``), so their folders go on ``sys.path`` before any test module is
imported. Their basenames are unique across these folders. Files that run as their own scripts
(``python tests/e2e/dummy_worker.py``, the workers the runtime tests spawn) do not see this file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
IMPORT_PATH = (
    ROOT,                        # benchmarks.harness as a package
    TESTS,                       # sshd_nodes, conftest_ssh, slurm_cluster, netns_nodes, ...
    TESTS / "e2e",               # own_cluster, kill9_load, the e2e tests' shared helpers
    TESTS / "runtime",           # tiny_model, worker_procs, transport_pair, servers_cluster
    ROOT / "benchmarks",         # the maintained benchmarks the tests check
    ROOT / "scripts",            # heldout_shapes, tiny_vlm_common
    ROOT / "lab" / "benchmarks",  # the lab's CPU tuning benchmarks
    ROOT / "lab" / "model",      # the tiny model's training and analysis scripts
)
for folder in reversed(IMPORT_PATH):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_model import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen2vl"))


@pytest.fixture(scope="session")
def bundle(tiny_ckpt: Path):  # an epdctl.runtime.model.ModelBundle
    from epdctl.runtime.model import load_bundle

    return load_bundle(str(tiny_ckpt), role="colocated")


@pytest.fixture(scope="session")
def images() -> list[bytes]:
    from tiny_model import make_image

    return [make_image(i) for i in range(10)]
