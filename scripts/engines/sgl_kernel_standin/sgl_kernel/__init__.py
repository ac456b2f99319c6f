"""Stand-in for the `sgl_kernel` package, so SGLang's real server starts on a CPU without AVX-512.

Why it exists: the kernels on PyPI (`sglang-kernel` 0.4.10, `sgl-kernel` 0.3.21) are CUDA builds,
and SGLang's CPU kernels build only from source with AVX-512/AMX code. SGLang 0.5.23 started with
SGLANG_USE_CPU_ENGINE=1 imports a few CPU kernel names at module load (and looks four up in
``torch.ops.sgl_kernel``) even where, with ``--attention-backend torch_native`` on a CPU without
AMX, it computes with plain torch. This package defines exactly those names, and every one of them
RAISES when called: it computes nothing, so a server that answers right with it on the path did
not use a kernel for what it answered. Any other name is missing (ImportError), as in a build
without that kernel, so SGLang's own fallbacks apply.

Every call is recorded before the raise: when EPDCTL_KERNEL_STANDIN_LOG names a file, one line
``call NAME pid=PID`` is appended to it, and ``load pid=PID`` when a process imports the package
(tests/e2e/test_sglang_cpu.py asserts the server loaded it and never called it).

scripts/engines/sglang-cpu.sh copies this package into the SGLang engine venv.
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

__version__ = "0.0.0+standin"
STANDIN = True

# `from sgl_kernel import NAME` done unguarded by SGLang 0.5.23 on the CPU path
# (sglang/kernels/ops/kvcache/cache_move.py, mem_cache and speculative modules).
NAMES = frozenset({
    "assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu", "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu", "copy_all_layer_kv_cache_cpu", "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu", "verify_tree_greedy_cpu",
})

# torch.ops.sgl_kernel.NAME looked up at import under SGLANG_USE_CPU_ENGINE=1
# (sglang/srt/models/qwen3_5.py, imported by the Qwen2-VL multimodal processor), with the schemas
# of sgl-kernel's CPU extension (sgl-kernel/csrc/cpu/torch_extension_cpu.cpp), so a call with
# SGLang's own arguments reaches the raising body and is recorded.
OPS: dict[str, str] = {
    "fused_sigmoid_mul_cpu": "fused_sigmoid_mul_cpu(Tensor(a!) input, Tensor gate) -> ()",
    "fused_qk_gemma_rmsnorm_cpu": ("fused_qk_gemma_rmsnorm_cpu(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, "
                                   "float eps, int head_dim) -> (Tensor, Tensor)"),
    "fused_qk_gemma_rmsnorm_with_gate_cpu": (
        "fused_qk_gemma_rmsnorm_with_gate_cpu(Tensor q_gate, Tensor k, Tensor q_weight, Tensor k_weight, float eps, "
        "int head_dim, int num_head) -> (Tensor, Tensor, Tensor)"),
    "fused_qkvzba_split_reshape_cat_contiguous_cpu": (
        "fused_qkvzba_split_reshape_cat_contiguous_cpu(Tensor mixed_qkvz, Tensor mixed_ba, int num_heads_qk, "
        "int num_heads_v, int head_qk, int head_v) -> (Tensor, Tensor, Tensor, Tensor)"),
}


class StandinKernelCalled(RuntimeError):
    """A kernel of the stand-in sgl_kernel was called: the real kernel is not installed."""


def _record(event: str) -> None:
    path = os.environ.get("EPDCTL_KERNEL_STANDIN_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{event} pid={os.getpid()}\n")


def _raiser(qualname: str) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> NoReturn:
        _record(f"call {qualname}")
        raise StandinKernelCalled(f"{qualname} called: this sgl_kernel is the stand-in whose functions only "
                                  "raise (scripts/engines/sgl_kernel_standin); this path needs the real kernel build")

    kernel.__name__ = kernel.__qualname__ = qualname.rsplit(".", 1)[-1]
    return kernel


def __getattr__(name: str) -> Any:
    if name not in NAMES:
        raise AttributeError(f"module 'sgl_kernel' (stand-in) has no attribute {name!r}")
    return _raiser(f"sgl_kernel.{name}")


def _register_ops() -> Any:
    import torch

    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    for name, schema in OPS.items():
        lib.define(schema)
        lib.impl(name, _raiser(f"torch.ops.sgl_kernel.{name}"), "CompositeExplicitAutograd")
    return lib


_LIBRARY = _register_ops()  # kept alive: the ops live as long as this object
_record("load")
