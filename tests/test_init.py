"""`epdctl init`: node facts (recorded nvidia-smi / ibv_devinfo / ibstat / ip outputs) -> a topology
that validates and renders. End to end over the real sshd nodes and inside a real SLURM
allocation, where fake tools on PATH print the recorded outputs (the nodes have no GPU or RDMA)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from conftest_ssh import sshd  # noqa: F401
from slurm_cluster import SlurmCluster, slurm_cluster

from epdctl.errors import EpdctlError
from epdctl.init.compose import NodeIn, choose
from epdctl.init.inventory import inventory
from epdctl.init.write import render
from epdctl.preflight.records import Facts
from epdctl.render import build_plan
from epdctl.topology import topology_from_text

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "preflight"
QWEN = "Qwen2VLForConditionalGeneration"
# what each fake node reports: nvidia-smi --query-gpu csv, ibv_devinfo -v, ibstat
HW = [("nvidia_smi_query_8xh100.csv", "ibv_devinfo_v_link_layer_ib.txt", None),
      ("nvidia_smi_query_8xh100.csv", "ibv_devinfo_v_roce_gids.txt", None),
      ("nvidia_smi_query_8xh100.csv", None, "ibstat_ib_200g.txt")]


def _facts(name: str, smi: str | None, devinfo: str | None, ibstat: str | None) -> Facts:
    def probe(f: str | None) -> dict:
        return {"rc": 0, "out": (FIX / f).read_text()} if f else {"rc": 127, "out": "", "err": "command not found"}

    return Facts(name, {"nvidia_smi": probe(smi), "ibv_devinfo": probe(devinfo), "ibstat": probe(ibstat),
                        "ip_addr": probe("ip_j_addr_this_machine.json"),
                        "net_speed": {"rc": 0, "out": "/sys/class/net/eth0/speed:25000\n"}})


def _compose(n: int, arch: str | None = QWEN, hw: list = HW, **kw: object) -> tuple[str, object]:
    nodes = [NodeIn(f"g{i}", f"10.0.0.{i + 1}", inventory(_facts(f"g{i}", *hw[i % len(hw)]))) for i in range(n)]
    c = choose(nodes, "/models/Qwen2-VL-7B-Instruct", arch, kw.pop("engine", None), kw.pop("tp", None))  # type: ignore[arg-type]
    text = render("t", nodes, c, model_path="/models/Qwen2-VL-7B-Instruct", arch=arch, launcher="ssh",
                  python="python3", setup=(), how="test", schema_path="x.json")
    topo = topology_from_text(text)
    build_plan(topo)
    return text, topo


def test_inventory_reads_gpus_and_every_nic_kind() -> None:
    inv = inventory(_facts("a", *HW[0]))
    assert len(inv.gpus) == 8 and inv.gpus[0].name == "NVIDIA H100 80GB HBM3" and inv.gpus[0].memory_mib == 81559
    assert [(n.name, n.kind) for n in inv.nics] == [("mlx5_0", "ib"), ("eth0", "eth")]
    eth = inv.nics[1]
    assert eth.ip == "192.0.2.2" and eth.speed_gbps == 25.0
    roce = inventory(_facts("b", *HW[1])).rdma[0]
    assert roce.kind == "roce" and roce.ip  # the RoCE GID's IPv4
    ib = inventory(_facts("c", *HW[2])).rdma[0]
    assert (ib.name, ib.kind, ib.speed_gbps) == ("mlx5_7", "ib", 200.0)
    none = inventory(_facts("d", None, None, None))
    assert not none.gpus and any("no GPUs" in x for x in none.notes) and any("RDMA" in x for x in none.notes)


@pytest.mark.parametrize("n,tp", [(1, 2), (2, 4), (3, 4), (5, 8), (8, 2)])
def test_split_validates_for_any_node_count(n: int, tp: int) -> None:
    text, topo = _compose(n, tp=tp)
    roles = {w.role.value for w in topo.workers}
    assert roles == {"encoder", "prefill", "decode"}, text
    assert "How it was chosen" in text and "transfer: " in text
    assert ("nodes mix InfiniBand and RoCE" in text) == (n > 1)  # the recorded nodes are ib, roce, ib
    assert topo.transfer.backend == "mooncake"
    if n >= 3:  # whole nodes per role, every GPU used
        for node in topo.nodes:
            assert len({w.role for w in topo.workers if node.name in w.nodes}) <= 1
        assert sum(w.settings.gpus for w in topo.workers) == 8 * n


def test_one_node_too_small_for_every_role_is_a_clear_error() -> None:
    with pytest.raises(EpdctlError, match="no GPU is left for an encoder"):
        _compose(1, tp=4)


def test_text_only_model_gets_no_encoder_and_tp_from_the_model_size(tmp_path: Path) -> None:
    _, topo = _compose(3, arch="LlavaForConditionalGeneration")
    assert "encoder" not in {w.role.value for w in topo.workers}
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": [QWEN], "text_config": {
        "hidden_size": 8192, "num_hidden_layers": 80, "intermediate_size": 29568, "vocab_size": 152064,
        "num_attention_heads": 64, "num_key_value_heads": 8}}))  # Qwen2-VL-72B-Instruct's text config
    nodes = [NodeIn(f"g{i}", f"10.0.0.{i}", inventory(_facts("g", *HW[0]))) for i in range(3)]
    c = choose(nodes, str(model), QWEN, None, None)
    assert c.tp == 4 and any("~72.7B parameters" in w for w in c.why), c.why  # 145 GB of bf16: 4 x 80 GB at 60%


def test_no_gpus_means_the_embedded_engine_and_no_rdma_means_tcp() -> None:
    text, topo = _compose(2, hw=[(None, None, None)])
    assert topo.engine == "embedded" and topo.transfer.backend == "zmq"
    text, topo = _compose(3, hw=[("nvidia_smi_query_8xh100.csv", None, None)], tp=8)
    assert "Mooncake falls back to TCP" in text


def _fake_tools(root: Path, per_node: dict[str, tuple[str | None, str | None, str | None]]) -> Path:
    """bin/ with nvidia-smi, ibv_devinfo, ibstat printing each node's recorded output; the node is
    $SLURMD_NODENAME (srun) or the server address of $SSH_CONNECTION (sshd)."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    for node, files in per_node.items():
        d = root / "out" / node
        d.mkdir(parents=True)
        for tool, f in zip(("nvidia-smi", "ibv_devinfo", "ibstat"), files):
            if f:
                (d / tool).write_text((FIX / f).read_text())
    for tool in ("nvidia-smi", "ibv_devinfo", "ibstat"):
        (bin_dir / tool).write_text(
            "#!/bin/sh\n"
            f'node=${{SLURMD_NODENAME:-$(echo "$SSH_CONNECTION" | cut -d" " -f3)}}\n'
            f'f="{root}/out/$node/{tool}"\n'
            f'[ -f "$f" ] || {{ echo "{tool}: no device" >&2; exit 1; }}\n'
            'cat "$f"\n')
        (bin_dir / tool).chmod(0o755)
    return bin_dir


def _epdctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "epdctl", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), **env})


@pytest.fixture(scope="module")
def sshd_port() -> int:
    return 35422


def test_init_over_ssh_on_real_sshd_nodes(sshd, tmp_path: Path) -> None:  # noqa: F811
    fake = _fake_tools(tmp_path / "fake", {n.host: HW[i] for i, n in enumerate(sshd.nodes)})
    hosts = ",".join(f"{sshd.user}@{n.host}:{n.port}" for n in sshd.nodes)
    out = tmp_path / "cluster.yaml"
    env = {"EPDCTL_SSH_CONFIG": "", "EPDCTL_KNOWN_HOSTS": str(sshd.known_hosts)}
    proc = _epdctl("init", "--hosts", hosts + ",root@127.0.0.99:1", "--model", "/models/Qwen2-VL-7B-Instruct",
                   "--arch", QWEN, "--tp", "4", "--ssh-key", str(sshd.client_key),
                   "--setup", f"export PATH={fake}:$PATH", "-o", str(out), env=env)
    assert proc.returncode == 1 and not out.exists(), proc.stdout + proc.stderr  # one dead node: nothing written
    assert "127.0.0.99" in proc.stderr and "--skip-unreachable" in proc.stderr and "Traceback" not in proc.stderr
    proc = _epdctl("init", "--hosts", hosts, "--model", "/models/Qwen2-VL-7B-Instruct", "--arch", QWEN, "--tp", "4",
                   "--ssh-key", str(sshd.client_key), "--setup", f"export PATH={fake}:$PATH", "-o", str(out), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = yaml.safe_load(out.read_text())
    assert [n["host"] for n in doc["nodes"]] == [n.host for n in sshd.nodes]
    assert [n["gpus"] for n in doc["nodes"]] == [8, 8, 8]
    kinds = [sorted(x["kind"] for x in n["nics"]) for n in doc["nodes"]]
    assert kinds == [["eth", "ib"], ["eth", "roce"], ["eth", "ib"]], kinds
    assert doc["nodes"][0]["ssh"] == {"user": sshd.user, "port": sshd.port, "key": str(sshd.client_key)}
    assert doc["transfer"]["backend"] == "mooncake" and set(doc["roles"]) == {"encoder", "prefill", "decode"}
    text = out.read_text()
    assert text.startswith("# yaml-language-server: $schema=") and "# How it was chosen:" in text
    assert _epdctl("validate", str(out), env=env).returncode == 0
    assert _epdctl("render", str(out), env=env).returncode == 0


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    yield from slurm_cluster()


def test_init_inside_a_real_slurm_allocation(slurm: SlurmCluster, tmp_path: Path) -> None:
    fake = _fake_tools(tmp_path / "fake", {"node1": HW[0], "node2": HW[1]})
    out = tmp_path / "job.yaml"
    cmd = [sys.executable, "-m", "epdctl", "init", "--slurm", "--model", "/models/Qwen2-VL-7B-Instruct",
           "--arch", QWEN, "--tp", "4", "--python", sys.executable, "--setup", f"export PATH={fake}:$PATH",
           "-o", str(out)]
    proc = slurm.run("salloc", "-N2", "--partition", slurm.partition, *cmd, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = yaml.safe_load(out.read_text())
    assert doc["launcher"] == "slurm" and [n["name"] for n in doc["nodes"]] == ["node1", "node2"]
    assert doc["slurm"]["partition"] == slurm.partition and doc["slurm"]["gpus_per_node"] == 8
    assert [sorted(x["kind"] for x in n["nics"]) for n in doc["nodes"]] == [["eth", "ib"], ["eth", "roce"]]
    assert "srun in SLURM job" in out.read_text()
    r = _epdctl("render", str(out), "--launcher", "slurm", env={})
    assert r.returncode == 0 and "#SBATCH --nodes=2" in r.stdout, r.stdout[-2000:] + r.stderr


def test_init_from_ssh_config_hosts(sshd, tmp_path: Path) -> None:  # noqa: F811
    fake = _fake_tools(tmp_path / "fake", {n.host: HW[2] for n in sshd.nodes})
    cfg = tmp_path / "ssh_config"
    cfg.write_text("".join(f"Host gpu-{i}\n  HostName {n.host}\n  Port {n.port}\n  User {sshd.user}\n"
                           f"  IdentityFile {sshd.client_key}\n" for i, n in enumerate(sshd.nodes))
                   + "Host login\n  HostName 127.0.0.99\nHost gpu-*\n  StrictHostKeyChecking yes\n")
    out = tmp_path / "from-config.yaml"
    env = {"EPDCTL_SSH_CONFIG": str(cfg), "EPDCTL_KNOWN_HOSTS": str(sshd.known_hosts)}
    proc = _epdctl("init", "--ssh-config-hosts", "gpu-*", "--model", "/models/m", "--arch", QWEN, "--tp", "2",
                   "--setup", f"export PATH={fake}:$PATH", "-o", str(out), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = yaml.safe_load(out.read_text())
    assert [(n["name"], n["host"]) for n in doc["nodes"]] == [(f"gpu-{i}", f"gpu-{i}") for i in range(3)]
    assert all(n["nics"][0] == {"name": "mlx5_7", "kind": "ib", "speed_gbps": 200} for n in doc["nodes"])
    assert _epdctl("validate", str(out), env=env).returncode == 0
    bad = _epdctl("init", "--ssh-config-hosts", "cpu-*", "--model", "/m", "-o", str(tmp_path / "x.yaml"), env=env)
    assert bad.returncode == 1 and "no Host entry" in bad.stderr and "gpu-0" in bad.stderr
