"""`epdctl diagnose` over every real tool output in tests/fixtures/preflight/real/ (collected from
public issue threads, PRs and the testdata of leptonai/gpud; sources in each file's #% header
and in INDEX.yaml). Each file must be attributed to the right tool and judged as INDEX says."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from epdctl.preflight.diagnose import judge_file, judge_text

REAL = Path(__file__).parent / "fixtures" / "preflight" / "real"
INDEX = yaml.safe_load((REAL / "INDEX.yaml").read_text())["files"]
BY_FILE = {e["file"]: e for e in INDEX}


def test_the_index_lists_every_file_and_every_file_names_its_source():
    on_disk = sorted(p.name for p in REAL.iterdir() if p.name != "INDEX.yaml")
    assert on_disk == sorted(BY_FILE)
    assert len(on_disk) >= 40
    for name in on_disk:
        head = (REAL / name).read_text(errors="replace").splitlines()[:4]
        assert head[0].startswith(("#% source: https://", "#% source: local:")), name
        assert any(h.startswith("#% shows: ") for h in head), name


def test_counts_per_tool_and_verdict():
    counts = collections.Counter((e.get("family", e["tool"].split()[0]), e["verdict"]) for e in INDEX)
    tools = collections.Counter(e.get("family", e["tool"].split()[0]) for e in INDEX)
    print("\nreal outputs per tool:", dict(sorted(tools.items())))
    print("per (tool, verdict):", dict(sorted(counts.items())))
    # every tool family the issue names is covered, healthy and broken where both exist
    assert {"ibv_devinfo", "ibstat", "ibstatus", "ibdev2netdev", "show_gids", "perftest",
            "nvidia-smi", "lsmod", "ulimit", "mooncake"} <= set(tools)
    for tool in ("ibv_devinfo", "ibstat", "perftest", "nvidia-smi", "mooncake", "ulimit"):
        assert counts[(tool, "fail")] and (counts[(tool, "pass")] or counts[(tool, "warn")]), tool


@pytest.mark.parametrize("name", sorted(BY_FILE))
def test_diagnose_names_the_tool_and_the_verdict(name):
    want = BY_FILE[name]
    j = judge_file(REAL / name)
    assert (j.tool, j.verdict) == (want["tool"], want["verdict"]), [
        (f.level, f.message) for f in j.findings]
    assert j.kind == want.get("family", j.kind)  # the reader's family beside the program's name
    if j.verdict != "pass":
        bad = [f for f in j.findings if f.level == j.verdict]
        assert bad and all(f.message and f.advice for f in bad), "warn/fail must say what to do"


def test_cli_json_shape_and_exit_status_over_all_files():
    files = [str(REAL / e["file"]) for e in INDEX]
    proc = subprocess.run([sys.executable, "-m", "epdctl", "diagnose", "--json", *files],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr          # some files fail
    doc = json.loads(proc.stdout)
    assert [f["file"] for f in doc["files"]] == files
    for f in doc["files"]:
        assert set(f) == {"file", "tool", "family", "verdict", "facts", "findings"}
        assert f["verdict"] in ("pass", "warn", "fail")
        for finding in f["findings"]:
            assert set(finding) == {"level", "message", "advice"}
    healthy = [str(REAL / e["file"]) for e in INDEX if e["verdict"] != "fail"]
    ok = subprocess.run([sys.executable, "-m", "epdctl", "diagnose", *healthy],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout[-2000:]
    assert "Traceback" not in ok.stdout + ok.stderr


def test_facts_that_matter_are_read():
    gids = judge_file(REAL / "show_gids_macvlan_pod.txt").facts
    assert gids["recommended_gid_index"] == {"mlx5_0": 7, "mlx5_1": 7}
    csv = judge_file(REAL / "nvidia_smi_query_name_first.csv").facts
    assert [g["index"] for g in csv["gpus"]] == ["0", "1", "2", "3", "4"]
    vf = judge_file(REAL / "ibv_devinfo_vf_init_zero_guid.txt")
    assert any("subnet manager" in f.advice for f in vf.findings if f.level == "fail")
    assert any("GUID" in f.message for f in vf.findings)
    partial = judge_file(REAL / "ibv_devinfo_failed_open_vfs_k8s.txt")
    assert partial.facts["ports"][0]["device"] == "mlx4_2"       # exit 1 does not hide it
    mem = judge_file(REAL / "ulimit_l_docker_64mib.txt")
    assert "--ulimit memlock=-1" in mem.findings[0].advice
    rtr = judge_file(REAL / "mooncake_bench_rtr_timeout.txt")
    assert rtr.facts["devices"] == {"mlx5_0": 1}
    assert any("MC_GID_INDEX" in f.advice for f in rtr.findings)
    for name, cause in (("mooncake_store_register_enomem.txt", "memlock"),
                        ("mooncake_pd_register_efault.txt", "nvidia_peermem"),
                        ("mooncake_ppu_register_erange.txt", "max_mr_size")):
        advice = [f.advice for f in judge_file(REAL / name).findings if f.level == "fail"]
        assert any(cause in a for a in advice), (name, advice)     # the errno decides the cause
    bw = judge_file(REAL / "ib_write_bw_post_list_gbits.txt").facts
    assert bw["avg_gbps"] == 0.48 and bw["link_type"] == "Ethernet"


def test_text_no_tool_prints_is_not_recognised_never_a_pass():
    for text in ("", "hello world\n", "Traceback (most recent call last):\n  oops\n",
                 "#% source: x\n"):
        j = judge_text(text)
        assert j.tool == "unknown" and j.verdict == "fail"
        assert "not recognised" in j.findings[0].message


def test_missing_file_is_one_failed_item(tmp_path):
    j = judge_file(tmp_path / "nope.txt")
    assert j.verdict == "fail" and "cannot read" in j.findings[0].message
