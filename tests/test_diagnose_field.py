"""Tool outputs that were misread: ibstatus with no device in sysfs, nvidia-smi table rows with
ERR! pasted without the header, a Mooncake transfer_engine_bench run over TCP, and the names
`diagnose --json` gives tools (as users call them, the reader's family beside). The real outputs
are in tests/fixtures/preflight/real/ (sources in their headers, verdicts in INDEX.yaml)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from epdctl.node import sysfs_rdma
from epdctl.preflight.diagnose import judge_file, judge_text
from epdctl.preflight.mooncake_log import judge_mooncake

REAL = Path(__file__).parent / "fixtures" / "preflight" / "real"


def test_agent_ibstatus_of_an_empty_sysfs_is_what_ibstatus_prints_and_fails(tmp_path: Path) -> None:
    text = sysfs_rdma.ibstatus_text(tmp_path)
    real = (REAL / "ibstatus_no_devices_sysfs_trinity219.txt").read_text().splitlines()[-1]
    assert text.strip() == real.replace("/sys/class/infiniband", str(tmp_path))
    j = judge_text(text)
    assert (j.tool, j.verdict) == ("ibstatus", "fail")
    assert "load the kernel driver" in j.findings[0].advice


def test_err_rows_without_header_name_the_gpu() -> None:
    j = judge_file(REAL / "nvidia_smi_table_rows_err_fan_exporter393.txt")
    assert j.facts["count"] == 2 and [g["index"] for g in j.facts["gpus"]] == [13, 14]
    bad = [f.message for f in j.findings if f.level == "fail"]
    assert len(bad) == 1 and bad[0].startswith("GPU 14 (00000000:CC:00.0): a field reads ERR!")


def test_tcp_bench_fails_and_rdma_bench_is_judged_against_the_line_rate() -> None:
    tcp = judge_file(REAL / "mooncake_bench_tcp_026gbs_issue6.txt")
    assert tcp.facts["throughput_gbps"] == 2.08 and tcp.facts["unit_assumed"] is True
    assert tcp.verdict == "fail" and "over TCP" in tcp.findings[-1].message
    # the same result line from a run that opened RDMA NICs: judged against the NICs' line rate
    body = (REAL / "mooncake_bench_tcp_026gbs_issue6.txt").read_text().splitlines()[-1]
    rdma = ("I0306 02:45:59.716431 157201 rdma_context.cpp:140] RDMA device: mlx5_0, LID: 0, GID: "
            "(GID_Index 3) 00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:01\n")
    fast = body.replace("throughput 0.26", "throughput 45.10 GB/s")
    assert judge_mooncake(rdma + fast, line_rate_gbps=400).verdict == "pass"  # 360.8 of 400 Gb/s
    slow = judge_mooncake(rdma + fast, line_rate_gbps=800)  # two 400G rails: 45% of the line rate
    assert slow.verdict == "fail" and "45% of the line rate" in slow.findings[-1].message


def test_json_names_tools_as_users_do_with_the_family() -> None:
    files = [REAL / "ib_write_bw_post_list_gbits.txt", REAL / "mooncake_bench_tcp_026gbs_issue6.txt",
             REAL / "ibstatus_roce_400g_ndr_exporter26.txt", REAL / "gpud_nvidia_smi_q_535_8gpu.txt",
             REAL / "mooncake_sglang_pd_rtr.txt"]
    out = subprocess.run([sys.executable, "-m", "epdctl", "diagnose", "--json", *map(str, files)],
                         capture_output=True, text=True, timeout=120)
    got = [(f["tool"], f["family"]) for f in json.loads(out.stdout)["files"]]
    assert got == [("ib_write_bw", "perftest"), ("transfer_engine_bench", "mooncake"), ("ibstatus", "rdma"),
                   ("nvidia-smi -q", "nvidia-smi"), ("mooncake", "mooncake")]
