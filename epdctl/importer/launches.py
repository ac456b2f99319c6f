"""Which command lines are engine servers or routers, and their flags as the installed engine reads
them (migrated to SGLang 0.5.23, abbreviations written in full)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from epdctl.engines import engine_for
from epdctl.importer.container import container_of
from epdctl.importer.shell import Command
from epdctl.topology.engine_flags import FlagTable, flag_table
from epdctl.topology.migrations import Applied, migrate_args

# vLLM spellings -> the names the assembler reads (SGLang's); everything else keeps vLLM's spelling.
VLLM_COMMON = {"--model": "--model-path", "--tensor-parallel-size": "--tp-size", "-tp": "--tp-size",
               "--pipeline-parallel-size": "--pp-size", "-pp": "--pp-size", "--data-parallel-size": "--dp-size",
               "-dp": "--dp-size", "--max-num-batched-tokens": "--chunked-prefill-size", "--block-size": "--page-size",
               "--max-num-seqs": "--max-running-requests", "--gpu-memory-utilization": "--mem-fraction-static",
               "--mm-encoder-only": "--encoder-only"}
ROUTER_MODULES = {"sglang_router.launch_router": "sglang-router", "smg.launch_router": "smg",
                  "sglang.srt.disaggregation.mini_lb": "mini_lb"}


@dataclass
class Launch:
    """A server or router command with its flags as (canonical flag, values) in input order."""

    cmd: Command
    kind: str  # sglang | vllm | router
    module: str
    flags: list[tuple[str, list[str]]]
    applied: list[Applied] = field(default_factory=list)
    container: dict[str, Any] | None = None  # the docker/podman run or pyxis srun around it
    router_impl: str | None = None

    def get(self, flag: str, default: str | None = None) -> str | None:
        for f, vals in self.flags:
            if f == flag:
                return vals[0] if vals else ""
        return default

    def values(self, flag: str) -> list[str] | None:
        """Every value of ``flag``, across repeats (``--prefill URL PORT --prefill URL``)."""
        found = [vals for f, vals in self.flags if f == flag]
        return [v for vals in found for v in vals] if found else None

    def repeats(self, flag: str) -> list[list[str]]:
        return [vals for f, vals in self.flags if f == flag]

    def has(self, flag: str) -> bool:
        return any(f == flag for f, _ in self.flags)


def split_flags(tokens: list[str], table: FlagTable | None) -> list[tuple[str, list[str]]]:
    """Tokens into (flag, values); a known switch takes no value, unknown flags take what follows."""
    out: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("-") or tok == "-":
            if out:
                out[-1][1].append(tok)  # a stray value stays with the flag before it
            continue
        name, eq, inline = tok.partition("=")
        opt = table.resolve(name) if table is not None else None
        vals: list[str] = [inline] if eq else []
        if not eq and (opt is None or opt.takes_value):
            while i < len(tokens) and not tokens[i].startswith("--"):
                vals.append(tokens[i])
                i += 1
                if opt is not None and opt.nargs in (None, 1, "?"):
                    break
        out.append((name, vals))
    return out


def _module(argv: list[str]) -> tuple[str | None, int]:
    """(module after ``python -m``, index of its first argument), or the ``vllm serve`` form."""
    for i, tok in enumerate(argv[:-1]):
        if tok == "-m" and i > 0 and argv[i - 1].rsplit("/", 1)[-1].startswith("python"):
            return argv[i + 1], i + 2
    for i, tok in enumerate(argv):
        base = tok.rsplit("/", 1)[-1]
        if base == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return "vllm serve", i + 2
        if base == "sglang" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return "sglang.launch_server", i + 2  # the `sglang serve` CLI runs the same server
        if base == "smg":
            return "smg", i + 1
    return None, 0


def classify(cmd: Command, migrate: bool = True) -> Launch | None:
    """The launch this command line is, or None for anything else (curl, mkdir, a frontend)."""
    module, start = _module(cmd.argv)
    if module is None:
        return None
    rest = cmd.argv[start:]
    if module in ROUTER_MODULES or module == "smg":
        impl = ROUTER_MODULES.get(module, "smg")
        if impl == "sglang-router" and "--mini-lb" in rest:
            impl = "mini_lb"  # sglang-router's Python mini load balancer
        return Launch(cmd, "router", module, split_flags(rest, None), router_impl=impl)
    if module == "sglang.launch_server" or module.endswith(".sglang") or module == "sglang.srt.server":
        migrated, applied = migrate_args(rest, "sglang", apply_table=migrate)
        table = engine_for("sglang").flags(None, module)  # a wrapper's own flags are read as the wrapper reads them
        return Launch(cmd, "sglang", module, split_flags(migrated, table), applied, container=container_of([*cmd.wrapper, *cmd.argv]))
    if module in ("vllm serve", "vllm.entrypoints.openai.api_server"):
        if module == "vllm serve" and rest and not rest[0].startswith("-"):
            rest = ["--model", rest[0]] + rest[1:]
        return Launch(cmd, "vllm", module, vllm_common(split_flags(rest, flag_table("vllm"))),
                      container=container_of([*cmd.wrapper, *cmd.argv]))
    return None


def vllm_common(flags: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """vLLM flags under the names the assembler reads; --master-addr/--master-port -> --dist-init-addr."""
    out = [(VLLM_COMMON.get(f, f), v) for f, v in flags if f not in ("--master-addr", "--master-port")]
    addr = next((v[0] for f, v in flags if f == "--master-addr" and v), None)
    port = next((v[0] for f, v in flags if f == "--master-port" and v), None)
    if addr is not None:
        out.append(("--dist-init-addr", [f"{addr}:{port}" if port else addr]))
    return out
