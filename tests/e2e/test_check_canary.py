"""`epdctl check --canary` on a real local cluster: every E->P and P->D pair moves bytes that the
workers' own /metrics count, and a pair that cannot (an encoder killed behind epdctl's back) is
named and fails the check.

Own cluster (not the session one): ports 30800-30899, its own EPDCTL_STATE_DIR, so it can be
broken at the end without disturbing other tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NAME = "canarypairs"
BASE = 30800


class Live:
    def __init__(self, tmp: Path):
        src = ROOT / "topologies" / "local.yaml"
        doc = yaml.safe_load(src.read_text())
        doc["name"] = NAME
        doc["ports"] = {"base": BASE, "limit": BASE + 99}
        doc["model"]["path"] = str((src.parent / doc["model"]["path"]).resolve())
        self.topology = tmp / "canary.yaml"
        self.topology.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"))
        self.up_output = ""

    def epdctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=self.env, cwd=ROOT,
                              text=True, capture_output=True, timeout=900)

    def state(self) -> dict[str, Any]:
        path = Path(self.env["EPDCTL_STATE_DIR"]) / "clusters" / NAME / "state.json"
        return json.loads(path.read_text())


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    c = Live(tmp_path_factory.mktemp("canary"))
    up = c.epdctl("up", str(c.topology), "--timeout", "600")
    c.up_output = up.stdout + up.stderr
    try:
        assert up.returncode == 0, f"epdctl up failed:\n{c.up_output}"
        yield c
    finally:
        down = c.epdctl("down", NAME)
        assert down.returncode == 0, down.stdout + down.stderr


def test_up_ran_the_preflight_and_counted_canary_bytes(live: Live) -> None:
    out = live.up_output
    assert "preflight:" in out and "node checks passed" in out, out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("transfers:"))
    assert "prefill-0 received" in line and "decode-0 received" in line, line
    assert "encoder-" in line and " sent " in line, line
    assert "(all inline)" in line, line  # the tiny model's embeddings are small: the /encode answer carries them
    tok = next(ln for ln in out.splitlines() if ln.strip().startswith("tokens:"))
    assert "prefill-0->decode-0 decoded 8 tokens equal to a prefill-only run" in tok, tok


def test_check_canary_lists_every_pair_with_bytes(live: Live) -> None:
    proc = live.epdctl("check", "--canary", NAME, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    pairs = {p["pair"]: p for p in doc["pairs"]}
    want = {"encoder-0->prefill-0", "encoder-1->prefill-0", "prefill-0->decode-0"}
    assert set(pairs) == want, pairs
    for p in pairs.values():
        assert p["ok"] and p["sent"] > 0 and p["received"] > 0, p
    assert pairs["prefill-0->decode-0"]["kind"] == "P->D"
    assert pairs["prefill-0->decode-0"]["correct"] >= 1
    assert doc["ok"] is True and doc["cluster"] == NAME and doc["engine"] == "embedded"
    # the token canary: the decode's tokens equal the prefill-only run's, with KV bytes counted
    [tok] = doc["tokens"]
    assert tok["pair"] == "prefill-0->decode-0" and tok["ok"], tok
    assert len(tok["tokens"]) == 8 and tok["tokens"] == tok["reference"], tok
    assert tok["first_mismatch"] is None and tok["kv_bytes"] > 0, tok

    table = live.epdctl("check", "--canary", str(live.topology))  # a topology file works too
    assert table.returncode == 0, table.stdout + table.stderr
    for label in want:
        assert label in table.stdout
    assert "all 3 pairs moved data" in table.stdout
    assert "token canary" in table.stdout and "8/8" in table.stdout, table.stdout


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_native_generate_contract_and_bad_input(live: Live) -> None:
    """SGLang's /tokenize and /generate on real workers: prefill-only answers one token with
    top logprobs and sends no KV; bad bodies are 400s naming the field; workers export
    process_cpu_seconds_total (what `epdctl profile` charges each role)."""
    from epdctl.canary.tokens import kv_counters

    procs = {p["name"]: p for p in live.state()["processes"]}
    pre, dec = procs["prefill-0"]["url"], procs["decode-0"]["url"]
    status, tok = _post(pre + "/tokenize", {"prompt": "Picture 1:", "add_special_tokens": False})
    assert status == 200 and tok["count"] == len(tok["tokens"]) > 0, tok
    before = kv_counters(pre, None)[0]
    status, doc = _post(pre + "/generate", {
        "input_ids": tok["tokens"], "bootstrap_host": "2.2.2.2", "bootstrap_room": 5,
        "return_logprob": True, "top_logprobs_num": 3,
        "sampling_params": {"temperature": 0, "max_new_tokens": 1}})
    assert status == 200, doc
    assert len(doc["output_ids"]) == 1 and doc["meta_info"]["prompt_tokens"] == tok["count"]
    top = doc["meta_info"]["output_top_logprobs"][0]
    assert len(top) == 3 and top[0][1] == doc["output_ids"][0] and top[0][0] >= top[1][0]
    assert kv_counters(pre, None)[0] == before  # prefill only: no KV went anywhere
    for url, body, words in [
        (pre, {"text": "x", "input_ids": [1], "bootstrap_room": 1}, "exactly one of"),
        (pre, {"text": "x", "image_data": ["x"], "bootstrap_room": 1}, "/v1/chat/completions"),
        (pre, {"input_ids": [10 ** 9], "bootstrap_room": 1}, "outside the vocabulary"),
        (dec, {"text": "x", "bootstrap_host": "2.2.2.2", "bootstrap_room": 1}, "prefill-only"),
        (dec, {"text": "x", "bootstrap_room": 1}, "bootstrap_host"),
    ]:
        status, err = _post(url + "/generate", body)
        assert status == 400 and words in err["error"]["message"], (body, err)
    import urllib.request

    for name in ("encoder-0", "prefill-0", "decode-0"):
        with urllib.request.urlopen(procs[name]["url"] + "/metrics", timeout=10) as r:
            assert "\nprocess_cpu_seconds_total " in r.read().decode(), name


def test_token_canary_names_a_pair_whose_kv_cannot_arrive(live: Live) -> None:
    """A decode pointed at a dead bootstrap port gets no KV: the pair fails, named, with why."""
    from types import SimpleNamespace

    from epdctl.canary.tokens import check_pair

    procs = {p["name"]: p for p in live.state()["processes"]}
    p = procs["prefill-0"]
    wrong = SimpleNamespace(name="prefill-0", url=p["url"], host=p["host"], bootstrap_port=9,
                            role="prefill")
    dec = SimpleNamespace(name="decode-0", url=procs["decode-0"]["url"], role="decode")
    r = check_pair(wrong, dec, api_key_env=None, tokens=4, timeout=60)
    assert not r.ok and r.reason.startswith("decode decode-0: HTTP"), r.reason


def test_a_dead_encoder_is_named(live: Live) -> None:
    rec = next(p for p in live.state()["processes"] if p["name"] == "encoder-1")
    os.killpg(rec["handle"]["pgid"], signal.SIGKILL)  # behind epdctl's back
    proc = live.epdctl("check", "--canary", NAME)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    bad = [ln for ln in proc.stdout.splitlines() if "FAIL" in ln]
    assert len(bad) == 1 and "encoder-1->prefill-0" in bad[0], proc.stdout
    assert "1 pair(s) failed: encoder-1->prefill-0" in proc.stdout
