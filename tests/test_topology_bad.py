"""Each broken topology under tests/topologies_bad/ gives the right message, path and line,
through `epdctl validate` (exit 1, no traceback) and through load_topology."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from epdctl.cli import cli
from epdctl.errors import TopologyError
from epdctl.topology import load_topology

BAD = Path(__file__).resolve().parent / "topologies_bad"

# file -> (YAML path, line, fragments of the message)
CASES: dict[str, tuple[str, int | None, tuple[str, ...]]] = {
    "unknown_key": ("roles.prefill.chunked_prefil_size", 16, ("unknown key", "did you mean 'chunked_prefill_size'",
                                                              "valid keys:")),
    "wrong_type": ("roles.prefill.tp", 16, ("expected an integer", "'eight'")),
    "gpus_overassigned": ("roles.prefill", 16, ("node 'n0' has 8 GPUs", "need 12", "prefill-2 (4)")),
    "node_in_two_roles": ("roles.decode", 17, ("node 'n0' is in two roles", "shared: true")),
    "port_collision": ("roles.prefill.workers[1]", 19, ("port 30100", "used twice", "prefill-0", "prefill-1")),
    "multinode_gpus_mismatch": ("roles.prefill.workers[0].nodes", 18, ("8*3*1 = 24 GPUs", "2-node worker")),
    "attn_dp_not_dividing_tp": ("roles.decode", 17, ("tp (8) must be a multiple of attention_dp (3)",)),
    "deepep_ep_not_tp": ("roles.decode", 17, ("deepep forces ep == tp", "ep 4, tp 8")),
    "dp_across_nodes": ("roles.decode.workers[0]", 20, ("dp = 2 replicas across 2 nodes", "attention_dp")),
    "unsupported_epd_arch": ("roles.encoder", 17, ("does not support encoder disaggregation",
                                                   "LlavaForConditionalGeneration")),
    "page_size_mismatch": ("roles.decode", 17, ("same page size", "prefill has 64, decode has 32")),
    "unknown_nic": ("roles.prefill.nics", 16, ("NIC 'mlx5_3' is not defined on node 'n0'", "has: mlx5_0")),
    "inline_api_key": ("router.api_key", 20, ("inline secret", "api_key_env")),
    "inline_secret_env": ("roles.prefill.env.HF_TOKEN", 21, ("inline secret", "${HF_TOKEN}")),
    "blog_flag_in_args": ("roles.decode.args", 17, ("--role is not a sglang 0.5.23 flag",)),
    "loopback_across_nodes": ("roles.prefill", 15, ("listens on 127.0.0.1", "set host: node")),
    "zmq_with_sglang": ("transfer.backend", 4, ("SGLang has no zmq KV transfer",)),
    "unknown_node": ("roles.decode.nodes[0]", 17, ("unknown node 'n9'", "defined nodes: n0, n1")),
    "duplicate_key": ("roles.decode", 18, ("duplicate key 'decode'", "first at line 17")),
    "invalid_yaml": ("", 4, ("invalid YAML",)),
    "empty": ("", None, ("empty",)),
    "binary": ("", None, ("binary file",)),
    "not_a_mapping": ("", 1, ("must be a YAML mapping",)),
    "missing_keys": ("", 1, ("missing required key 'model'",)),
    "bad_engine": ("engine", 2, ("did you mean 'sglang'",)),
    "router_args": ("router.args", 11, ("--encoder is not a smg 1.13.0 flag",)),
    "slurm_time_unquoted": ("slurm.time", 6, ("quote it",)),
}


def test_every_bad_file_has_a_case() -> None:
    assert sorted(p.stem for p in BAD.glob("*.yaml")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_topology_reports_path_line_and_fix(name: str) -> None:
    path, line, fragments = CASES[name]
    with pytest.raises(TopologyError) as info:
        load_topology(BAD / f"{name}.yaml")
    matching = [p for p in info.value.problems if p.path == path and all(f in p.message for f in fragments)]
    assert matching, [p.format() for p in info.value.problems]
    assert matching[0].line == line


@pytest.mark.parametrize("name", sorted(CASES))
def test_validate_cli_exits_1_without_traceback(name: str) -> None:
    result = CliRunner().invoke(cli, ["validate", str(BAD / f"{name}.yaml")])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    _, line, fragments = CASES[name]
    assert fragments[0] in result.output
    if line is not None:
        assert f"{name}.yaml:{line}" in result.output


def test_missing_file_and_directory() -> None:
    runner = CliRunner()
    for target, fragment in ((BAD / "nope.yaml", "no such file"), (BAD, "is a directory")):
        result = runner.invoke(cli, ["validate", str(target)])
        assert result.exit_code == 1 and fragment in result.output


def test_all_problems_are_listed_at_once(tmp_path: Path) -> None:
    text = (BAD / "unknown_key.yaml").read_text().replace("tp: 8}", 'tp: "x", bogus: 1}')
    (tmp_path / "t.yaml").write_text(text)
    with pytest.raises(TopologyError) as info:
        load_topology(tmp_path / "t.yaml")
    messages = " | ".join(p.message for p in info.value.problems)
    assert "chunked_prefil_size" in messages and "'bogus'" in messages and "expected an integer" in messages
