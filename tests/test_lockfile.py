"""epdctl.lock: what it records from real preflight outputs (nvidia-smi, ibv_devinfo and
/proc/driver/nvidia/version of real machines), that it holds no secret, and that `epdctl diff`
names exactly the fields that changed."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from epdctl.cli import cli
from epdctl.errors import EpdctlError
from epdctl.lockfile import diff as lockdiff
from epdctl.lockfile.build import build_lock, node_facts
from epdctl.preflight.records import Facts
from epdctl.render import build_plan
from epdctl.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]
PRE = ROOT / "tests" / "fixtures" / "preflight"
DRIVERS = sorted((ROOT / "tests" / "fixtures" / "nvidia_driver").glob("*.txt"))


def _facts(node: str, driver: Path = DRIVERS[0], sglang: str = "0.5.23 (sglang)") -> Facts:
    text = driver.read_text().split("\n", 2)[2]
    return Facts(node, probes={
        "nvidia_smi": {"rc": 0, "out": (PRE / "nvidia_smi_query_8xh100.csv").read_text()},
        "nvidia_driver": {"rc": 0, "out": text},
        "ibv_devinfo": {"rc": 0, "out": (PRE / "ibv_devinfo_v_rate_100g.txt").read_text()},
    }, versions={"python": "3.11.7", "epdctl": "0.1.0 (epdctl)", "sglang": sglang,
                 "pyzmq": "26.2.0 (pyzmq)", "mooncake": "0.3.7 (mooncake-transfer-engine)"})


@pytest.mark.parametrize("path", DRIVERS, ids=lambda p: p.stem)
def test_driver_version_from_real_version_files(path: Path) -> None:
    expect = path.read_text().splitlines()[1].split(":", 1)[1].strip()
    assert node_facts(_facts("n", path), ("python",))["driver"] == expect


def test_node_facts_from_real_outputs() -> None:
    got = node_facts(_facts("gpu01"), ("python", "sglang"))
    assert got["gpus"][0] == "0: NVIDIA H100 80GB HBM3 (81559 MiB)" and len(got["gpus"]) == 8
    assert got["nics"] == [{"device": "mlx5_0", "port": 1, "link_layer": "Ethernet",
                            "state": "ACTIVE", "rate_gbps": 100.0}]
    assert got["versions"] == {"python": "3.11.7", "sglang": "0.5.23 (sglang)"}


def _lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sglang: str = "0.5.23 (sglang)",
          topo_path: Path = ROOT / "topologies" / "qwen2vl-epd.yaml") -> dict:
    monkeypatch.setenv("EPD_ROUTER_API_KEY", "sk-live-very-secret")
    topo = load_topology(topo_path)
    facts = [_facts(n.name, sglang=sglang) for n in topo.nodes]
    return build_lock(topo, build_plan(topo), facts)


def test_lock_records_what_ran_and_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = _lock(tmp_path, monkeypatch)
    assert doc["epdctl"]["version"] and doc["engine"]["name"] == "sglang"
    assert doc["engine"]["versions"]["e0"]["sglang"] == "0.5.23 (sglang)"
    assert doc["model"]["source"] == "/models/Qwen2-VL-7B-Instruct" and "revision" in doc["model"]
    assert doc["container"] is None  # the field exists; a `container:` block fills it
    assert doc["router"] == {"api_key_env": "EPD_ROUTER_API_KEY"}
    decode = doc["processes"]["decode-0"]
    assert decode["node"] == "d0" and "--disaggregation-mode" in decode["argv"]
    assert set(doc["nodes"]) == {"e0", "p0", "d0"} and doc["nodes"]["d0"]["driver"] == "35.3.1"
    out = tmp_path / "epdctl.lock"
    lockdiff.write(doc, out)
    assert "sk-live-very-secret" not in out.read_text()
    assert lockdiff.read(out) == yaml.safe_load(out.read_text())
    assert out.stat().st_mode & 0o777 == 0o640


def test_diff_names_exactly_the_changed_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = _lock(tmp_path, monkeypatch)
    b = _lock(tmp_path, monkeypatch, sglang="0.5.24 (sglang)")
    argv = b["processes"]["decode-0"]["argv"]
    i = argv.index("--page-size")
    argv[i + 1] = "32"
    b["run"]["written"] = "another time"  # when and where it ran is never a difference
    changes = lockdiff.diff(a, b)
    assert [c.path for c in changes] == [
        "engine.versions.d0.sglang", "engine.versions.e0.sglang", "engine.versions.p0.sglang",
        "nodes.d0.versions.sglang", "nodes.e0.versions.sglang", "nodes.p0.versions.sglang",
        f"processes.decode-0.argv[{i + 1}]"]
    text = lockdiff.render(changes)
    assert "~ engine.versions.d0.sglang: 0.5.23 (sglang) -> 0.5.24 (sglang)" in text
    assert f"~ processes.decode-0.argv[{i + 1}]: 64 -> 32" in text
    # a flag added: one change, the inserted tokens, not every later position shifted
    c = copy.deepcopy(a)
    c["processes"]["prefill-0"]["argv"][3:3] = ["--enable-metrics"]
    (only,) = lockdiff.diff(a, c)
    assert only.path == "processes.prefill-0.argv[3]" and only.render().startswith("  + ")

    pa, pb = tmp_path / "a.lock", tmp_path / "b.lock"
    lockdiff.write(a, pa)
    lockdiff.write(b, pb)
    res = CliRunner().invoke(cli, ["diff", str(pa), str(pb)])
    assert res.exit_code == 1 and "7 field(s) differ" in res.output, res.output
    assert "64 -> 32" in res.output
    same = CliRunner().invoke(cli, ["diff", str(pa), str(pa)])
    assert same.exit_code == 0 and "no differences" in same.output


def test_diff_of_what_is_not_a_lock(tmp_path: Path) -> None:
    bad = tmp_path / "x.lock"
    bad.write_text("name: [unclosed\n")
    res = CliRunner().invoke(cli, ["diff", str(bad), str(bad)])
    assert isinstance(res.exception, EpdctlError) and "line 2 is not valid YAML" in str(res.exception)
    bad.write_text("name: x\n")
    res = CliRunner().invoke(cli, ["diff", str(bad), str(bad)])
    assert isinstance(res.exception, EpdctlError) and "not an epdctl lock" in str(res.exception)


def test_lock_keeps_the_image_and_its_id_per_node() -> None:
    """A container topology: the images the workers run, and each node's image id as the
    preflight's `container image` check found it; another id on a node is a diff."""
    topo = load_topology(ROOT / "topologies" / "local-container.yaml")
    image_id = "783477a53a95716706b0cd088424639309f4a41c23566cd90afb8cfd85531138"  # podman image inspect
    doc = build_lock(topo, build_plan(topo), [_facts("local")], None,
                     {"local": {"localhost/epdctl-runtime:bookworm": image_id}})
    assert doc["container"] == {"images": ["localhost/epdctl-runtime:bookworm"],
                                "image_digest": {"local": {"localhost/epdctl-runtime:bookworm": image_id}}}
    other = copy.deepcopy(doc)
    other["container"]["image_digest"]["local"]["localhost/epdctl-runtime:bookworm"] = "0" * 64
    changes = lockdiff.diff(doc, other)
    assert [c.path for c in changes] == ["container.image_digest.local.localhost/epdctl-runtime:bookworm"]
    assert build_lock(topo, build_plan(topo), None)["container"]["image_digest"] is None  # no preflight
