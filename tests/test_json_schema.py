"""The committed topology JSON Schema: generated from the readers, accepts every example, and never
rejects what `validate` accepts (checked on the broken fixtures and on fuzzed examples)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings

from epdctl.cli import cli
from epdctl.errors import TopologyError
from epdctl.topology import load_topology, topology_from_text
from epdctl.topology.jsonschema_gen import dumps, generate
from test_fuzz_validate import mutated

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "epdctl" / "topology" / "topology.schema.json"
EXAMPLES = sorted((ROOT / "topologies").glob("*.yaml"))
VALIDATOR = jsonschema.Draft202012Validator(generate())


def _yaml(path: Path) -> bool:
    try:
        yaml.safe_load(path.read_text(encoding="utf-8"))
        return True
    except (yaml.YAMLError, UnicodeDecodeError, ValueError):
        return False


# Broken fixtures that are not YAML at all (binary, invalid syntax) never reach a schema:
# validate rejects them when reading (tests/test_topology_bad.py covers them).
BAD = [p for p in sorted((ROOT / "tests" / "topologies_bad").glob("*.yaml")) if _yaml(p)]


def _data(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_committed_schema_is_generated() -> None:
    assert COMMITTED.read_text(encoding="utf-8") == dumps(), "regenerate: epdctl schema -o " + str(COMMITTED)
    jsonschema.Draft202012Validator.check_schema(generate())


def test_schema_command_check_and_stdout() -> None:
    assert CliRunner().invoke(cli, ["schema", "--check"]).exit_code == 0
    out = CliRunner().invoke(cli, ["schema"]).output
    assert out == dumps()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_reference_and_pass_the_schema(path: Path) -> None:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first == "# yaml-language-server: $schema=../epdctl/topology/topology.schema.json"
    assert (path.parent / first.split("=", 1)[1]).resolve() == COMMITTED
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in VALIDATOR.iter_errors(_data(path))]
    assert not errors, errors
    load_topology(path)


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.name)
def test_schema_rejection_implies_validate_rejection(path: Path) -> None:
    data = _data(path)
    with pytest.raises(TopologyError):
        load_topology(path)  # every broken fixture is rejected by validate
    if not VALIDATOR.is_valid(data):
        return
    # the schema accepts it: only a cross-field rule (placement, ports, engine flags) can catch it
    assert path.stem in CROSS_FIELD, f"{path.name}: schema accepts it; is the rule a per-key one?"


# fixtures whose problem no per-key schema can see (they need the whole topology)
CROSS_FIELD = {"attn_dp_not_dividing_tp", "blog_flag_in_args", "deepep_ep_not_tp", "dp_across_nodes",
               "gpus_overassigned", "loopback_across_nodes", "multinode_gpus_mismatch", "node_in_two_roles",
               "page_size_mismatch", "port_collision", "router_args", "unknown_nic", "unknown_node",
               "unsupported_epd_arch", "zmq_with_sglang", "inline_secret_env", "duplicate_key"}


def test_schema_catches_the_per_key_fixtures() -> None:
    rejected = {p.stem for p in BAD if _loads(p) is not None and not VALIDATOR.is_valid(_loads(p))}
    assert {"unknown_key", "wrong_type", "bad_engine", "inline_api_key", "missing_keys"} <= rejected


def _loads(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, ValueError):
        return None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=mutated())
def test_fuzzed_examples_schema_never_stricter_than_validate(text: str) -> None:
    data = yaml.safe_load(text)
    if VALIDATOR.is_valid(data):
        return
    with pytest.raises(TopologyError):
        topology_from_text(text, ROOT / "topologies" / "x.yaml")
