"""`epdctl check` for workers in containers: the probe's parsers on real outputs (podman on this
machine: tests/fixtures/containers/probe/; nvidia-smi and ulimit from public sources:
tests/fixtures/preflight/real/), then the real CLI against real podman: the runtime and image
found, memlock read inside a probe container started with the worker's own options (the
topology's value vs the default --ulimit memlock=-1, which this machine's podman cannot grant),
/dev/infiniband passed where RDMA NICs are declared, GPUs asked for, and a missing image."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from epdctl.preflight import container_text as text
from epdctl.preflight.judgement import FAIL, PASS

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "fixtures" / "containers" / "probe"
REAL = ROOT / "tests" / "fixtures" / "preflight" / "real"
TOPOLOGY = ROOT / "topologies" / "local-container.yaml"
IMAGE = "localhost/epdctl-runtime:bookworm"
PODMAN = ["podman", "--cgroup-manager=cgroupfs", "--events-backend=file"]
podman = pytest.mark.skipif(shutil.which("podman") is None or os.geteuid() != 0,
                            reason="needs rootful podman (scripts/test.sh installs it)")


def _body(path: Path) -> str:
    """A fixture without its ``#%`` source header lines."""
    return "".join(ln for ln in path.read_text().splitlines(keepends=True) if not ln.startswith("#%"))


# ---- parsers on real outputs ---------------------------------------------------------------

def test_the_default_probe_output_of_podman_here() -> None:
    s = text.read_sections(_body(PROBE / "podman_default_probe.txt"))
    assert set(s) == {text.MEMLOCK, text.INFINIBAND, text.GPUS, text.EXIT} and s[text.EXIT] == "127"
    mem = text.judge_memlock(s[text.MEMLOCK])
    assert mem.verdict == FAIL and mem.facts["memlock_kib"] == 8192
    assert "--ulimit memlock=-1" in mem.findings[0].advice
    ib = text.judge_infiniband(s[text.INFINIBAND])
    assert ib.verdict == FAIL and "--device /dev/infiniband" in ib.findings[0].advice
    assert "MELLANOX_VISIBLE_DEVICES" in ib.findings[0].advice
    gpu = text.judge_gpus(s[text.GPUS], s[text.EXIT])
    assert gpu.verdict == FAIL and "not in the container" in gpu.findings[0].message
    assert "nvidia-ctk cdi generate" in gpu.findings[0].advice


@pytest.mark.parametrize("name, verdict, kib", [
    ("ulimit_l_docker_64mib.txt", FAIL, 65536), ("ulimit_Ha_unlimited.txt", PASS, "unlimited"),
    ("ulimit_a_containerd_64mib.txt", FAIL, 65536)])
def test_memlock_inside_from_public_outputs(name: str, verdict: str, kib: Any) -> None:
    j = text.judge_memlock(_body(REAL / name))
    assert (j.verdict, j.facts["memlock_kib"]) == (verdict, kib)


def test_gpus_inside_from_public_outputs() -> None:
    ok = text.judge_gpus(_body(REAL / "nvidia_smi_L_quadro.txt"), "0")
    assert ok.verdict == PASS and ok.facts["count"] >= 1
    none = text.judge_gpus(_body(REAL / "nvidia_smi_no_devices_singularity.txt"), "6")
    assert none.verdict == FAIL and none.findings[0].advice


def test_infiniband_listing_with_verbs_devices() -> None:
    # what `ls -1 /dev/infiniband` lists on an HCA node: issm/umad per port, uverbs per device, rdma_cm
    j = text.judge_infiniband("issm0\nrdma_cm\numad0\nuverbs0\nuverbs1\n")
    assert j.verdict == PASS and j.facts["devices"] == ["issm0", "rdma_cm", "umad0", "uverbs0", "uverbs1"]
    assert text.judge_infiniband("rdma_cm\n").verdict == FAIL


@pytest.mark.parametrize("name, cause, fix", [
    ("podman_memlock_unlimited_rlimit.txt", "could not set memlock", "LimitMEMLOCK=infinity"),
    ("podman_no_infiniband_device.txt", "no /dev/infiniband", "ib_uverbs"),
    ("podman_cdi_unresolvable.txt", "cannot hand the GPUs", "nvidia-ctk cdi generate"),
    ("podman_no_such_image.txt", "not on the node", "podman pull"),
    ("podman_image_inspect_missing.txt", "not on the node", "podman load"),
    ("podman_missing_mount.txt", "mount source does not exist", "container.mounts"),
])
def test_why_a_container_did_not_start(name: str, cause: str, fix: str) -> None:
    what, advice = text.why_not_started(_body(PROBE / name))
    assert cause in what and fix in advice, (what, advice)
    assert _body(PROBE / name).strip().splitlines()[-1].strip() in what  # the runtime's own words


# ---- the real CLI against real podman --------------------------------------------------------

def _check(tmp: Path, **changes: Any) -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(TOPOLOGY.read_text())
    doc.update(python=str(ROOT / ".venv" / "bin" / "python"),
               model={**doc["model"], "path": str(ROOT / "models" / "tiny-qwen2vl")})
    doc["container"]["mounts"] = [{"source": str(ROOT), "readonly": True}]
    for key, value in changes.items():
        if key == "container":
            doc["container"].update(value)
        else:
            doc[key] = value
    path = tmp / "check.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = subprocess.run([sys.executable, "-m", "epdctl", "check", str(path), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    items = json.loads(proc.stdout)["checks"]
    return {i["check"]: i for i in items if i["check"].startswith("container")}


@pytest.fixture(scope="module")
def image() -> str:
    subprocess.run(["bash", str(ROOT / "scripts" / "build_container_image.sh")], check=True, timeout=900)
    return subprocess.run([*PODMAN, "image", "inspect", "--format", "{{.Id}}", IMAGE], capture_output=True,
                          text=True, check=True).stdout.strip()


@podman
def test_runtime_image_and_memlock_as_the_topology_sets_it(tmp_path: Path, image: str) -> None:
    got = _check(tmp_path)
    assert got["container runtime"]["level"] == "ok" and "podman version" in got["container runtime"]["detail"]
    assert f"present, id sha256:{image[:12]}" in got["container image"]["detail"]
    mem = got["container memlock"]  # ulimits.memlock: 8388608 -> 8192 KiB inside; no RDMA: a warning
    assert mem["level"] == "warn" and "limited to 8192 KiB" in mem["detail"]
    assert "--ulimit memlock=-1" in mem["detail"]


@podman
def test_the_default_memlock_unlimited_is_refused_by_this_podman(tmp_path: Path, image: str) -> None:
    got = _check(tmp_path, container={"ulimits": {"nofile": "20000:20000", "nproc": "32768:32768"}})
    probe = got["container probe"]
    assert probe["level"] == "fail" and "error setting rlimit type 8" in probe["detail"]
    assert "could not set memlock" in probe["detail"] and "LimitMEMLOCK=infinity" in probe["detail"]


@podman
def test_rdma_nics_put_infiniband_into_the_probe(tmp_path: Path, image: str) -> None:
    """A roce NIC declared: the probe gets --device /dev/infiniband, which this machine lacks."""
    doc = yaml.safe_load(TOPOLOGY.read_text())
    nodes = [{**doc["nodes"][0], "nics": [{"name": "mlx5_0", "kind": "roce", "ip": "127.0.0.1"}]}]
    got = _check(tmp_path, nodes=nodes)
    probe = got["container probe"]
    assert probe["level"] == "fail" and "stat /dev/infiniband: no such file or directory" in probe["detail"]
    assert "ib_uverbs" in probe["detail"]


@podman
def test_gpus_asked_for_are_checked(tmp_path: Path, image: str) -> None:
    got = _check(tmp_path, container={"gpus": "all"})
    probe = got["container probe"]  # podman's CDI has no nvidia.com/gpu spec here
    assert probe["level"] == "fail" and "unresolvable CDI devices nvidia.com/gpu=all" in probe["detail"]
    assert "nvidia-ctk cdi generate" in probe["detail"]


@podman
def test_a_missing_image_that_cannot_be_pulled(tmp_path: Path, image: str) -> None:
    got = _check(tmp_path, container={"image": "localhost/epdctl-no-such-image:1"})
    img = got["container image"]
    assert img["level"] == "fail" and "podman --cgroup-manager=cgroupfs --events-backend=file --runtime runc " \
                                      "pull localhost/epdctl-no-such-image:1` failed" in img["detail"]
    assert "connection refused" in img["detail"] and "container probe" not in got
