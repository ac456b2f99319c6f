"""The runtime tests' shared helpers, re-exported for ``from conftest import ...``; they live in
tiny_model (a plain module). The tiny checkpoint, bundle and images fixtures are in tests/conftest.py
(the lab's benchmark tests use them too).
"""

from __future__ import annotations

import pytest
from tiny_model import build_tiny_checkpoint, image_messages, make_image, reference_generate  # noqa: F401



@pytest.fixture
def fast_hashing():
    """The fast path's copy-and-hash (fast/native_copy.py) installed for one test, as ``--fast`` does."""
    from epdctl.runtime import wire
    from epdctl.runtime.fast.native_copy import NativeCopyHash

    wire.use_accelerator(NativeCopyHash())
    yield
    wire.use_accelerator(None)
