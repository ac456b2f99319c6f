"""Version-aware flags: migrations across SGLang releases, validate warnings and --fix, hints that
never change meaning, one problem per cause, secrets by value, YAML merge keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from epdctl.cli import cli
from epdctl.errors import TopologyError
from epdctl.topology import topology_from_text
from epdctl.topology.engine_flags import flag_table
from epdctl.topology.migrations import canonical_args, migrate_args, migration_table

ROOT = Path(__file__).resolve().parents[1]
HEAD = """name: t
engine: sglang
model: {path: /m}
transfer: {backend: mooncake}
nodes:
  - {name: a, host: 10.0.0.1, gpus: 8}
  - {name: b, host: 10.0.0.2, gpus: 8}
"""


def _problems(text: str) -> list[str]:
    with pytest.raises(TopologyError) as e:
        topology_from_text(text)
    return [p.format() for p in e.value.problems]


def test_parser_dump_records_sglang_deprecated_actions() -> None:
    doc = json.loads((ROOT / "epdctl/topology/flags/sglang.json").read_text())
    dep = {f: o["deprecated"]["replacement"] for o in doc["options"] if "deprecated" in o for f in o["flags"]}
    assert dep["--enable-dp-attention"] == "--attn-dp-size <dp-size>"
    assert dep["--disable-cuda-graph"].startswith("--cuda-graph-backend-")
    assert dep["--grpc-mode"] == "--smg-grpc-mode"


def test_migration_table_targets_exist_in_the_installed_parser() -> None:
    table = flag_table("sglang")
    for m in migration_table("sglang").values():
        if m.status == "removed":
            assert m.flag not in table.options, m.flag  # really gone from 0.5.23
        else:
            assert m.flag in table.options, m.flag  # still accepted, deprecated
        for tok in m.replacement:
            if tok.startswith("--"):
                assert tok in table.options, (m.flag, tok)
        target = table.options[m.replacement[0]] if m.kind == "rename" else None
        value = ["amd"] if m.takes_value else (
            [(target.choices or ("1",))[0]] if target is not None and target.takes_value else [])
        new, _ = migrate_args([m.flag] + value)
        assert table.check(new) == [], (m.flag, new)


def test_migrations_of_published_flags() -> None:
    new, applied = migrate_args(["--tp", "16", "--dp-size", "8", "--enable-dp-attention", "--enable-deepep-moe",
                                 "--cuda-graph-bs", "1", "2", "--prefill-round-robin-balance", "---nnodes", "2"])
    assert new == ["--tp-size", "16", "--attn-dp-size", "8", "--moe-a2a-backend", "deepep",
                   "--cuda-graph-bs-decode", "1", "2", "--nnodes", "2"]
    assert len(applied) == 6
    assert canonical_args(["--mem-frac", "0.8", "--tp-size", "2"], "sglang") == ["--mem-fraction-static", "0.8",
                                                                                 "--tp-size", "2"]


def test_hints_never_change_meaning() -> None:
    table = flag_table("sglang")
    assert table.check(["--tp", "16"]) == []  # the launcher's own abbreviation of --tp-size
    msg = table.check(["--enable-deepep-moe"])[0]
    assert "--moe-a2a-backend deepep" in msg and "--deepep-mode" not in msg
    assert "ambiguous" in table.check(["--pp", "2"])[0]
    assert "did you mean" not in table.check(["--encoder-server-url", "x"])[0]
    assert "did you mean --page-size" in table.check(["--page-sise", "64"])[0]  # a typo still gets help


def test_one_problem_per_cause_at_its_own_line() -> None:
    text = HEAD + """roles:
  prefill:
    nodes: [a]
    count: 1
    host: node
    args: [--cuda-graph-bs, 1, 2, 4, 8, 16, --bogus-flag, 3]
  decode:
    nodes: [b]
    count: 1
    host: node
"""
    probs = _problems(text)
    assert len(probs) == 2, probs
    assert all("line 13, roles.prefill.args" in p for p in probs), probs
    assert not any("is not a flag" in p for p in probs)


def test_role_args_reported_once_not_per_worker() -> None:
    text = HEAD + """roles:
  prefill:
    host: node
    args: [--no-such-flag]
    workers: [{node: a, tp: 1}, {node: a, tp: 1, port: 31000}]
  decode:
    nodes: [b]
    count: 1
    host: node
"""
    probs = _problems(text)
    assert [p for p in probs if "--no-such-flag" in p] == [probs[0]] and "roles.prefill.args" in probs[0]


def test_tp_alias_in_args_points_to_the_tp_key() -> None:
    text = HEAD + """roles:
  prefill: {nodes: [a], count: 1, host: node, args: [--tp, "2"]}
  decode: {nodes: [b], count: 1, host: node}
"""
    (p,) = _problems(text)
    assert "--tp (the engine reads it as --tensor-parallel-size)" in p or "--tp (the engine reads it as" in p
    assert "use the topology key" in p


def test_dp_with_enable_dp_attention_is_attention_dp() -> None:
    text = HEAD + """roles:
  prefill: {nodes: [a], count: 1, host: node, tp: 8, dp: 8, args: [--enable-dp-attention]}
  decode: {nodes: [b], count: 1, host: node, tp: 8}
"""
    topo = topology_from_text(text)  # no "needs 64 GPUs" error
    s = topo.workers[0].settings
    assert (s.tp, s.dp, s.attention_dp, s.args) == (8, 1, 8, ())


def test_all_problems_of_all_stages_in_one_run() -> None:
    text = HEAD + """roles:
  prefill: {nodes: [a], count: 1, tp: 2, bogus: 1}
  decode: {nodes: [b], count: 1}
router: {node: nowhere}
"""
    probs = " | ".join(_problems(text))
    assert "unknown key 'bogus'" in probs and "unknown node 'nowhere'" in probs


def test_validate_warns_and_fix_rewrites_keeping_comments(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(HEAD + """roles:
  prefill:
    nodes: [a]
    count: 1
    host: node
    tp: 8
    dp: 8   # attention DP
    args: [--enable-dp-attention, --enable-deepep-moe, --deepep-mode, normal, --disable-cuda-graph]
  decode:
    workers:
      - node: b
        host: node
        args:
          cuda-graph-max-bs: 128   # from the blog
""")
    res = CliRunner().invoke(cli, ["validate", str(path)])
    assert res.exit_code == 1
    assert "warning:" in res.output and "--cuda-graph-backend-decode disabled" in res.output
    assert "--enable-deepep-moe was removed" in res.output and "--moe-a2a-backend deepep" in res.output
    fixed = CliRunner().invoke(cli, ["validate", "--fix", str(path)])
    assert fixed.exit_code == 0, fixed.output
    text = path.read_text()
    assert "attention_dp: 8 # attention DP" in text or "attention_dp: 8   # attention DP" in text
    assert "cuda-graph-max-bs-decode: 128 # from the blog" in text or "cuda-graph-max-bs-decode: 128   #" in text
    assert "--enable-deepep-moe" not in text and "warning" not in CliRunner().invoke(cli, ["validate",
                                                                                          str(path)]).output


def test_secrets_by_value_not_by_name() -> None:
    base = HEAD + """roles:
  prefill: {nodes: [a], count: 1, host: node}
  decode: {nodes: [b], count: 1, host: node}
defaults:
  env: {ENV}
"""
    ok = topology_from_text(base.replace("{ENV}", "{SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK: 768, "
                                                  "MC_TE_METRIC: 'true', HF_TOKEN: '${HF_TOKEN}'}"))
    assert ok.workers[0].settings.env["SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"] == "768"
    for bad in ("MY_SETTING: sk-proj-abcdefghijklmnop12345", "HF_HOME_X: hf_AbCdEfGhIjKlMnOpQrStUvWx",
                "AWS_ID: AKIAIOSFODNN7EXAMPLE"):
        probs = _problems(base.replace("{ENV}", "{" + bad + "}"))
        assert any("inline secret" in p for p in probs), bad


def test_merge_keys_with_overrides() -> None:
    text = HEAD + """x-base: &base
  host: node
  tp: 2
roles:
  prefill:
    <<: *base
    tp: 4
    nodes: [a]
    count: 1
  decode:
    <<: *base
    nodes: [b]
    count: 1
"""
    topo = topology_from_text(text)
    assert [w.settings.tp for w in topo.workers] == [4, 2]
    dup = text.replace("    tp: 4\n", "    tp: 4\n    tp: 8\n")
    assert any("duplicate key 'tp'" in p for p in _problems(dup))
