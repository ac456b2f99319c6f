"""Each value the issue found injectable (a newline in a node name, router.host, the cluster name,
defaults.host, slurm.partition, slurm.extra) and a lone surrogate in a name: `validate` and
`render` answer exit 1 with the YAML path and line, never a traceback, never a rendered script.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from epdctl.cli import cli
from epdctl.errors import TopologyError
from epdctl.topology import topology_from_text
from epdctl.topology.safety import _host, is_host

ROOT = Path(__file__).resolve().parents[1]
SLURM = yaml.safe_load((ROOT / "topologies" / "slurm-local.yaml").read_text())


def _set(doc: dict, path: str, value: object) -> dict:
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    parent = doc
    for k in keys[:-1]:
        parent = parent.setdefault(k, {}) if isinstance(parent, dict) else parent[k]
    parent[keys[-1]] = value
    return doc


@pytest.mark.parametrize("path,value,expect", [
    ("nodes.0.name", "n0\ntouch /tmp/x", "nodes[0].name"),
    ("router.host", "127.0.0.1\nid", "router.host"),
    ("name", "c\nid", "name"),
    ("defaults.host", "0.0.0.0\nid", "defaults.host"),
    ("slurm.partition", "debug\nid", "slurm.partition"),
    ("slurm.extra", {"comment": "x\nid"}, "slurm.extra.comment"),
    ("slurm.extra", {"x\nid": "1"}, "slurm.extra"),
    ("nodes.0.name", "n\ud800", "nodes[0].name"),
    ("name", "a b", "name"),
    ("name", "$(id)", "name"),
    ("nodes.0.host", "h;id", "nodes[0].host"),
    ("router.host", "-oProxyCommand=id", "router.host"),
    ("slurm.partition", "debug queue", "slurm.partition"),
    ("slurm.time", "1:00;id", "slurm.time"),
    ("slurm.extra", {"Bad Option": "1"}, "slurm.extra.Bad Option"),
    ("nodes.0.ssh", {"user": "root;id"}, "nodes[0].ssh.user"),
    ("nodes.0.ssh", {"jump": "a@b:c:d"}, "nodes[0].ssh.jump"),
])
def test_unsafe_values_are_validation_errors(tmp_path: Path, path: str, value: object, expect: str) -> None:
    doc = _set(yaml.safe_load(yaml.safe_dump(SLURM)), path, value)
    text = yaml.safe_dump(doc, allow_unicode=True)
    with pytest.raises(TopologyError) as exc:
        topology_from_text(text, ROOT / "topologies" / "slurm-local.yaml")
    assert any(p.path == expect for p in exc.value.problems), exc.value.problems
    f = tmp_path / "t.yaml"
    f.write_text(text, encoding="utf-8", errors="surrogatepass")
    for cmd in (["validate", str(f)], ["render", str(f)]):
        result = CliRunner().invoke(cli, cmd)
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output and expect.split(".")[0] in result.output
        assert "#!/usr/bin/env bash" not in result.output  # nothing was rendered


@pytest.mark.parametrize("host,ok", [("10.1.0.10", True), ("::1", True), ("[fe80::1]", True), ("node-a.example.com", True),
                                     ("n0.slurm", True), ("gpu_01", True), ("h;id", False), ("a b", False),
                                     ("-oProxyCommand", False), ("", False), ("1.2.3.999", False), ("x" * 64, False)])
def test_is_host(host: str, ok: bool) -> None:
    assert is_host(host) is ok


@pytest.mark.parametrize("host,ok", [("${prefill_master_ip}", True), ("${A_1}", True), ("${x}y", False),
                                     ("x${A}", False), ("${A;id}", False), ("$(id)", False), ("${1A}", False)])
def test_a_whole_value_variable_reference_is_a_host(host: str, ok: bool) -> None:
    """epdctl import keeps a script's unset variables as ${NAME} hosts; rendered quoted, they expand."""
    assert (list(_host("nodes[0].host", host)) == []) is ok


def test_example_topologies_stay_valid() -> None:
    for path in sorted((ROOT / "topologies").glob("*.yaml")):
        topology_from_text(path.read_text(), path)
