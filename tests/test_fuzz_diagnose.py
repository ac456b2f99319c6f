"""Fuzz every tool reader/judge with mutated real outputs: each returns a judgement (or a clear
"not recognised"), never an exception. The readers are called directly, not only through
``judge_text`` (whose safety net would hide a reader that raises)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epdctl.preflight import gpu_text, host_judge, mooncake_log, perftest_judge, rdma_judge
from epdctl.preflight import rdma_netdev, rdma_text
from epdctl.preflight.diagnose import judge_text, recognise
from epdctl.preflight.judgement import Judgement
from epdctl.preflight.textprep import prepare

REAL = Path(__file__).parent / "fixtures" / "preflight" / "real"
SEEDS = sorted(p.read_text(errors="replace") for p in REAL.iterdir() if p.name != "INDEX.yaml")

READERS = [
    lambda t: rdma_judge.judge_ports("ibv_devinfo", rdma_text.read_ibv_devinfo(t)),
    lambda t: rdma_judge.judge_ports("ibstat", rdma_text.read_ibstat(t)),
    lambda t: rdma_judge.judge_ports("ibstatus", rdma_text.read_ibstatus(t)),
    lambda t: rdma_judge.judge_ports("rdma link", rdma_text.read_rdma_link(t)),
    lambda t: rdma_judge.judge_device_list(rdma_text.read_device_list(t)),
    lambda t: rdma_netdev.judge_ibdev2netdev(rdma_netdev.read_ibdev2netdev(t)),
    lambda t: rdma_netdev.judge_show_gids(rdma_netdev.read_show_gids(t), t),
    perftest_judge.judge_perftest,
    mooncake_log.judge_mooncake,
    host_judge.judge_lsmod,
    host_judge.judge_ulimit,
    *[lambda t, s=s: gpu_text.judge_nvidia_smi(t, s) for s in ("table", "csv", "list", "q", "error")],
    judge_text,
]
NOISE = st.sampled_from(["", ":", ",", "ERR!", "N/A", "PORT_ACTIVE (4)", "port:\t1", "hca_id:",
                         "CA '", "State: Active", "Rate: x", "GPU 0:", "0x", "65535", "(Up)",
                         "==>", "GID[ 3]:", "fe80::", "[N/A]", "Pending : Yes", "I0101 0:0:0.0 1 "
                         "rdma_context.cpp:1] RDMA device: x, LID: 9, GID: (GID_Index 3) fe:80",
                         "\t", "\x00", "é", "²", "--5", "³ 5 5", " 8 5000 0.1", "BW average[Gb/sec]", "Attached GPUs : 9"])


@st.composite
def mutated(draw) -> str:
    lines = draw(st.sampled_from(SEEDS)).splitlines()
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["drop", "cut", "insert", "dup", "swap"]))
        if not lines:
            lines = [""]
        i = draw(st.integers(0, len(lines) - 1))
        if op == "drop":
            del lines[i]
        elif op == "cut":
            lines[i] = lines[i][:draw(st.integers(0, max(0, len(lines[i]))))]
        elif op == "insert":
            lines.insert(i, draw(NOISE) + draw(st.text(max_size=12)))
        elif op == "dup":
            lines.insert(i, lines[i])
        else:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def _sane(j: Judgement) -> None:
    assert isinstance(j, Judgement)
    assert j.verdict in ("pass", "warn", "fail")
    assert all(f.level in ("pass", "warn", "fail") for f in j.findings)
    j.to_json()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_every_reader_survives_mutated_real_outputs(text):
    recognise(prepare(text))
    for read in READERS:
        _sane(read(text))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_every_reader_survives_arbitrary_text(text):
    for read in READERS:
        _sane(read(text))


PROBES = ("ibv_devinfo", "ibstat", "ibstatus", "ibdev2netdev", "gid_table", "nvidia_smi",
          "nvidia_smi_health", "nvidia_smi_L", "lsmod", "ulimit_l")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutated(), min_size=len(PROBES), max_size=len(PROBES)),
       st.lists(st.sampled_from([0, 1, 127, 255]), min_size=len(PROBES), max_size=len(PROBES)))
def test_check_node_judges_mutated_outputs_without_a_reader_raising(texts, rcs):
    from epdctl.preflight.node_checks import Facts, NicExpect, NodeExpect, check_node

    probes = {p: {"rc": rc, "out": t, "err": ""} for p, t, rc in zip(PROBES, texts, rcs)}
    expect = NodeExpect("n", nics=(NicExpect("mlx5_0", "roce", "10.0.0.1", 200),
                                   NicExpect("mlx4_2", "ib")), gpus=2, rdma_transport=True)
    items = check_node(expect, Facts("n", probes, {}, {}))
    assert items and not [i.detail for i in items if i.check.endswith(" read")]
    assert all(i.status in ("ok", "warn", "fail") for i in items)
