"""Fixtures for runtime tests: a tiny random Qwen2-VL checkpoint built offline once per session,
and a bundle loaded from it (colocated: both halves of the model).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# helpers live in tiny_model (a plain module); re-exported here for ``from conftest import ...``
from tiny_model import build_tiny_checkpoint, image_messages, make_image, reference_generate  # noqa: E402,F401


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Path:
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen2vl"))


@pytest.fixture(scope="session")
def bundle(tiny_ckpt):
    from epdctl.runtime.model import load_bundle

    return load_bundle(str(tiny_ckpt), role="colocated")


@pytest.fixture(scope="session")
def images() -> list[bytes]:
    return [make_image(i) for i in range(10)]
