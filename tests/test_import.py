"""`epdctl import` over real published launch sets (tests/fixtures/launch_sets/, sources in headers).

Each set is imported, validated, rendered, and compared with its own commands: >=95% of every
set's server flags (after migration to SGLang 0.5.23) must come back with the same values, the
multi-node wiring must be identical, the env must come back, and every rendered command must
parse with SGLang 0.5.23's own parser (when installed).
"""

from __future__ import annotations

import argparse
from itertools import takewhile
from pathlib import Path

import pytest
from click.testing import CliRunner

from epdctl.cli import cli
from epdctl.engines import engine_for
from epdctl.importer import import_scripts
from epdctl.importer.roundtrip import compare, load, summary
from epdctl.importer.shell import parse_script
from epdctl.render import build_plan
from epdctl.topology.migrations import migration_table

ROOT_SETS = Path(__file__).parent / "fixtures" / "launch_sets"
# one published set: a script, or a directory of scripts (one per node, plus the router's)
SETS = sorted([*ROOT_SETS.glob("*.sh"), *(d for d in ROOT_SETS.iterdir() if d.is_dir())])


def files(path: Path) -> list[str]:
    return [str(p) for p in sorted([*path.glob("*.sh"), *path.glob("*.yaml")])] if path.is_dir() else [str(path)]


def text_of(path: Path) -> str:
    return "\n".join(Path(f).read_text(encoding="utf-8") for f in files(path))
# Template, not a launch set: placeholders for tp and both ports, and --encoder-urls lists an encoder
# (30003) the same block never starts; see test_template_set_misses_only_its_placeholders.
TEMPLATES = {"mooncake-docs-sglang-epd.sh"}
# Published sets that hold only one role (the doc shows decode only): render works, validate asks for prefill.
PARTIAL = {"sglang-issue-7998-decode-ep-mtp.sh": "decode workers need prefill workers",
           "sglang-pr-19746-dynamo-prefill.sh": "prefill workers need decode workers"}


def test_at_least_six_real_sets_with_their_source() -> None:
    real = [p for p in SETS if p.name not in TEMPLATES]
    assert len(real) >= 6
    for p in SETS:
        for f in files(p):
            head = Path(f).read_text(encoding="utf-8").splitlines()[0]
            assert head.startswith("# source: https://"), f


@pytest.mark.parametrize("path", [p for p in SETS if p.name not in TEMPLATES], ids=lambda p: p.stem)
def test_launch_set_round_trips(path: Path) -> None:
    draft, text, _ = import_scripts(files(path))
    topo, problems = load(text)
    if path.name in PARTIAL:
        assert problems and all(PARTIAL[path.name] in p for p in problems), problems
    else:
        assert problems == [], problems
    results = compare(draft, text)
    matched, total, wiring = summary(results)
    assert total >= 10 and matched / total >= 0.95, [r.missing for r in results]
    assert wiring, [r.missing for r in results]
    assert all(not r.env_missing for r in results), [r.env_missing for r in results]
    assert len(results) == len(draft.origin) >= 1


@pytest.mark.parametrize("path", [p for p in SETS if p.name not in TEMPLATES], ids=lambda p: p.stem)
def test_every_old_flag_is_migrated_and_listed(path: Path) -> None:
    text = text_of(path)
    old = [f for f in migration_table("sglang") if f"{f} " in text or text.rstrip().endswith(f)]
    draft, out, _ = import_scripts(files(path))
    lines = out.splitlines()
    # the topology's header: "# Flags migrated to SGLang 0.5.23:", then one "#   " line per migration
    listed = list(takewhile(lambda line: line.startswith("#   "),
                            lines[lines.index("# Flags migrated to SGLang 0.5.23:") + 1:])) if old else []
    for flag in old:
        mine = [m for m in draft.migrations if flag in m]
        assert mine, (flag, draft.migrations)
        assert all(f"#   {m}" in listed for m in mine), (flag, listed)
    rendered = " ".join(" ".join(s.argv) for s in build_plan(load(out)[0]).workers)
    for flag in old:
        assert f"{flag} " not in rendered + " ", flag


def test_template_set_misses_only_its_placeholders() -> None:
    path = next(p for p in SETS if p.name == "mooncake-docs-sglang-epd.sh")
    draft, text, _ = import_scripts([str(path)], variables={"MODEL": "Qwen/Qwen3-VL-8B-Instruct"})
    assert "--tp-size $TP is a placeholder" in text
    missing = [m.split(" (")[0] for r in compare(draft, text) for m in r.missing]
    assert sorted(missing) == sorted(["--tp-size $TP", "--port $PORT", "--port $PORT",
                                      "--encoder-urls http://127.0.0.1:30002 http://127.0.0.1:30003"])


def _sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    return parser


def test_real_sglang_parser_accepts_every_imported_render() -> None:
    pytest.importorskip("sglang.srt.server_args", reason="sglang 0.5.23 (--no-deps) is not installed")
    parser = _sglang_parser()
    seen = 0
    for path in SETS:
        _, text, _ = import_scripts(files(path), variables={"MODEL": "m", "TP": "1", "MEM_FRACTION": "0.8",
                                                             "CHUNK_SIZE": "8192"})
        for spec in build_plan(load(text)[0]).workers:
            argv = list(spec.argv)
            if spec.container is not None:  # the server's command follows the runtime's options and image
                argv = argv[argv.index("-m") - 1:]
            ns, extra = parser.parse_known_args(argv[3:])
            # what SGLang's parser leaves is the wrapper's own (dynamo.sglang parses those first)
            wrapper = engine_for("sglang").flags(None, argv[2])
            assert not [t for t in extra if t.startswith("-") and wrapper.owner(t) is None], (path.name, spec.name,
                                                                                             extra)
            assert ns.model_path, spec.name
            seen += 1
    assert seen >= 30


def test_shell_reading() -> None:
    script = """#!/bin/bash
export NCCL_IB_HCA=mlx5_0   # exported for what follows
source /opt/venv/bin/activate
# prefill 0
$ MC_TE_METRIC=true nohup python3 -m sglang.launch_server --model-path "/m x" \\
    --tp 2 \\
    --port 30000 > prefill.log 2>&1 &
curl -s http://localhost:30000/health
HEAD=10.0.0.1
python -m sglang_router.launch_router --pd-disaggregation --prefill http://${HEAD}:30000 | tee r.log
"""
    cmds = parse_script(script, "s.sh")
    assert [c.line for c in cmds] == [5, 8, 10]
    srv = cmds[0]
    assert srv.setup == ["source /opt/venv/bin/activate"]
    assert srv.comment == "prefill 0"
    assert srv.env == {"MC_TE_METRIC": "true"} and srv.exported == {"NCCL_IB_HCA": "mlx5_0"}
    assert srv.argv == ["python3", "-m", "sglang.launch_server", "--model-path", "/m x", "--tp", "2", "--port",
                        "30000"]
    assert cmds[2].argv[-1] == "http://10.0.0.1:30000"  # the script's own variable, expanded as the shell would


def test_several_files_make_one_topology(tmp_path: Path) -> None:
    p = tmp_path / "prefill.sh"
    d = tmp_path / "decode.sh"
    r = tmp_path / "router.sh"
    p.write_text("python -m sglang.launch_server --model-path /m --disaggregation-mode prefill --host 10.0.0.1 "
                 "--port 30000 --disaggregation-ib-device mlx5_0\n")
    d.write_text("python -m sglang.launch_server --model-path /m --disaggregation-mode decode --host 10.0.0.2 "
                 "--port 30001 --disaggregation-ib-device mlx5_0 --disaggregation-bootstrap-port 9000\n")
    r.write_text("python -m sglang.srt.disaggregation.mini_lb --prefill http://10.0.0.1:30000 9000 "
                 "--decode http://10.0.0.2:30001 --host 0.0.0.0 --port 8000\n")
    draft, text, _ = import_scripts([str(p), str(d), str(r)])
    topo, problems = load(text)
    assert problems == []
    assert topo.router is not None and topo.router.implementation == "mini_lb"
    plan = build_plan(topo)
    assert plan.router is not None and "--mini-lb" in plan.router.argv
    pre = next(w for w in topo.workers if w.role.value == "prefill")
    dec = next(w for w in topo.workers if w.role.value == "decode")
    assert pre.bootstrap_port == 9000 and dec.bootstrap_port == 9000  # router's and decode's, first-class
    dec_argv = next(s.argv for s in plan.workers if s.name == "decode-0")
    assert dec_argv[dec_argv.index("--disaggregation-bootstrap-port") + 1] == "9000"
    assert "sglang.srt.disaggregation.mini_lb" in text or "mini_lb" in text


def test_cli_import_writes_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "t.yaml"
    src = next(p for p in SETS if p.name == "sglang-docs-pd-deepep-mooncake-v0.4.sh")
    res = CliRunner().invoke(cli, ["import", str(src), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "round trip: render reproduces 58/58" in res.output
    assert "migrated" in res.output and "--enable-deepep-moe" in res.output
    again = CliRunner().invoke(cli, ["import", str(src), "-o", str(out)])
    assert again.exit_code != 0 and "--force" in again.output
    ok = CliRunner().invoke(cli, ["validate", str(out)])
    assert ok.exit_code == 0, ok.output


@pytest.mark.parametrize("name", ["deepseek-v3-pp4-ep32", "qwen2vl-epd", "vllm-llava-onevision"])
def test_render_import_render_is_identity(name: str, tmp_path: Path) -> None:
    """epdctl's own renders (PP4 x TP8 prefill over 4 nodes, EPD with 8 encoders) come back whole; the
    PP prefill case here is our own output, not a published set (none was found, see docs)."""
    from epdctl.render import to_shell
    from epdctl.topology import load_topology

    script = tmp_path / f"{name}.sh"
    script.write_text(to_shell(build_plan(load_topology(Path(__file__).parents[1] / "topologies" / f"{name}.yaml"))))
    draft, text, _ = import_scripts([str(script)])
    assert load(text)[1] == []
    matched, total, wiring = summary(compare(draft, text))
    results = compare(draft, text)
    assert matched == total and wiring and all(not r.env_missing for r in results), [r.env_missing for r in results]


@pytest.mark.parametrize("path", [p for p in SETS if p.name not in TEMPLATES], ids=lambda p: p.stem)
def test_old_flags_get_their_replacement_and_fix_makes_them_pass(path: Path, tmp_path: Path) -> None:
    """Imported without migration, every removed or deprecated flag of the published set is named
    with its replacement by `validate`; `validate --fix` rewrites them and the topology passes."""
    text = text_of(path)
    old = [m for f, m in migration_table("sglang").items() if f"{f} " in text or text.rstrip().endswith(f)]
    _, raw, _ = import_scripts(files(path), migrate=False)
    out = tmp_path / "t.yaml"
    out.write_text(raw, encoding="utf-8")
    res = CliRunner().invoke(cli, ["validate", str(out)])
    for m in old:
        named = [line for line in res.output.splitlines() if m.flag in line]
        assert named and all(" ".join(m.replacement).split(" <")[0] in line or m.kind == "dp_attention"
                             for line in named), (m.flag, res.output)
    fixed = CliRunner().invoke(cli, ["validate", "--fix", str(out)])
    if path.name in PARTIAL:
        assert PARTIAL[path.name] in fixed.output and "1 problem(s)" in fixed.output, fixed.output
    else:
        assert fixed.exit_code == 0, fixed.output
    again = CliRunner().invoke(cli, ["validate", str(out)])
    assert "warning" not in again.output
    from epdctl.topology import topology_from_text

    topo = topology_from_text(out.read_text(), cross_checks=False)
    left = {tok for w in topo.workers for tok in w.settings.args}
    assert not left & {m.flag for m in old}, left & {m.flag for m in old}


def test_sglang_serve_cli_and_restated_defaults(tmp_path: Path) -> None:
    script = tmp_path / "s.sh"
    script.write_text("sglang serve --model-path /m --disaggregation-mode prefill --host 10.0.0.1 --port 30000 "
                      "--pp-size 8 --nnodes 1 --node-rank 0\n"
                      "sglang serve --model-path /m --disaggregation-mode decode --host 10.0.0.2 --port 30001\n")
    draft, text, _ = import_scripts([str(script)])
    topo, problems = load(text)
    assert problems == [] and topo.workers[0].settings.pp == 8
    matched, total, wiring = summary(compare(draft, text))
    assert (matched, total, wiring) == (11, 11, True)  # --nnodes 1 / --node-rank 0 are SGLang's defaults
