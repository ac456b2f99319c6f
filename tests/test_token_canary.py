"""The P->D token canary's verdicts against SGLang-shaped workers (SGLang needs GPUs, so these
are HTTP servers answering with SGLang 0.5.23's response shapes and /metrics series; the same
canary runs against real embedded workers in tests/e2e/test_check_canary.py).

A stub "model" predicts next = (sum of ids * 7) % 97. The prefill answers prefill-only runs
(bootstrap_host 2.2.2.2) with that prediction and its top-2 logprobs; the decode answers the
pair run with a token list the test chooses: equal to the prediction (KV arrived), diverging
with a wide margin (the decode used another KV), or diverging where the prefill's top two are
nearly tied (numerics, not a failure).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from epdctl.canary import tokens as token_canary
from epdctl.canary.encoders import encoder_counts
from epdctl.canary.tokens import FAKE_BOOTSTRAP_HOST, check_pair

FIX = Path(__file__).parent / "fixtures" / "sglang"
PROMPT_IDS = [11, 12, 13]


def predict(ids: list[int]) -> int:
    return (sum(ids) * 7) % 97


def greedy(n: int) -> list[int]:
    ids, out = list(PROMPT_IDS), []
    for _ in range(n):
        t = predict(ids)
        out.append(t)
        ids.append(t)
    return out


@dataclass
class Worker:
    name: str
    url: str
    host: str = "127.0.0.1"
    bootstrap_port: int = 8998
    role: str = "prefill"
    is_leader: bool = True


class Stub:
    """One prefill and one decode on two ports, with knobs the tests turn."""

    def __init__(self) -> None:
        self.decode_tokens: list[int] | None = None   # None: the right greedy tokens
        self.margin = 3.0
        self.kv_mib = 12.5
        self.kv_per_run = 0.25                        # MiB the prefill counts per pair run
        self.count_after_reads = 0                    # /metrics reads before a run's MiB are counted
        self._pending: list[list[float]] = []         # [reads left, MiB] per run not counted yet
        self.seen: list[dict[str, Any]] = []
        self.servers = [self._server("prefill"), self._server("decode")]

    def _server(self, role: str) -> ThreadingHTTPServer:
        stub = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/metrics" and role == "prefill":
                    for p in stub._pending:
                        p[0] -= 1
                        if p[0] < 0:
                            stub.kv_mib += p[1]
                    stub._pending = [p for p in stub._pending if p[0] >= 0]
                    text = (FIX / "metrics_prefill_kv.txt").read_text().replace(
                        "} 12.5", f"}} {stub.kv_mib}")
                    self._send(200, text, "text/plain")
                else:
                    self._send(404, {"error": "no"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.seen.append({"role": role, "path": self.path, **body})
                if self.path == "/tokenize":
                    self._send(200, {"tokens": PROMPT_IDS, "count": 3, "max_model_len": 4096})
                    return
                n = body["sampling_params"]["max_new_tokens"]
                ids = body["input_ids"]
                if role == "prefill":
                    t = predict(ids)
                    meta: dict[str, Any] = {"id": "x", "finish_reason": {"type": "length", "length": 1},
                                            "prompt_tokens": len(ids), "completion_tokens": 1}
                    if body.get("bootstrap_host") != FAKE_BOOTSTRAP_HOST:
                        stub._pending.append([stub.count_after_reads, stub.kv_per_run])
                    if body.get("return_logprob"):
                        meta["output_top_logprobs"] = [[[-0.01, t, "a"],
                                                        [-0.01 - stub.margin, (t + 1) % 97, "b"]]]
                    self._send(200, {"text": "a", "output_ids": [t], "meta_info": meta})
                else:
                    out = stub.decode_tokens if stub.decode_tokens is not None else greedy(n)
                    self._send(200, {"text": "...", "output_ids": out[:n],
                                     "meta_info": {"id": "x", "prompt_tokens": len(ids),
                                                   "completion_tokens": n}})

        srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv

    def worker(self, role: str) -> Worker:
        srv = self.servers[0 if role == "prefill" else 1]
        return Worker(role, f"http://127.0.0.1:{srv.server_address[1]}", role=role)

    def close(self) -> None:
        for s in self.servers:
            s.shutdown()


@pytest.fixture()
def stub() -> Iterator[Stub]:
    s = Stub()
    yield s
    s.close()


def test_matching_tokens_pass_with_kv_bytes_from_sglangs_histogram(stub: Stub) -> None:
    r = check_pair(stub.worker("prefill"), stub.worker("decode"), api_key_env=None, tokens=6)
    assert r.ok, r.reason
    assert r.tokens == r.reference == greedy(6)
    assert r.kv_bytes == pytest.approx(0.25 * 1024 * 1024)
    assert r.kv_transfers == 0.0 and r.byte_source == "sglang:kv_transfer_total_mb"
    # the pair run went to both with one room and the prefill's bootstrap address, like smg
    pair = [s for s in stub.seen if s["path"] == "/generate" and s.get("bootstrap_port") == 8998]
    assert {s["role"] for s in pair} == {"prefill", "decode"}
    assert len({s["bootstrap_room"] for s in pair}) == 1
    assert all(s["bootstrap_host"] == "127.0.0.1" for s in pair)
    # the reference: one prefill-only run per position, teacher-forced on the decode's tokens
    ref = [s for s in stub.seen if s.get("bootstrap_host") == FAKE_BOOTSTRAP_HOST]
    assert [len(s["input_ids"]) for s in ref] == [3, 4, 5, 6, 7, 8]
    assert all(s["role"] == "prefill" and s["sampling_params"]["max_new_tokens"] == 1 for s in ref)


def test_a_decode_that_diverges_fails_naming_the_token(stub: Stub) -> None:
    good = greedy(6)
    stub.decode_tokens = good[:2] + [(good[2] + 5) % 97] + good[3:]
    r = check_pair(stub.worker("prefill"), stub.worker("decode"), api_key_env=None, tokens=6)
    assert not r.ok and r.first_mismatch == 2 and not r.near_tie
    assert "token 2" in r.reason and "did not use this prefill's KV" in r.reason


def test_a_near_tie_is_reported_not_failed(stub: Stub) -> None:
    good = greedy(4)
    stub.decode_tokens = good[:3] + [(good[3] + 1) % 97]
    stub.margin = 0.001
    r = check_pair(stub.worker("prefill"), stub.worker("decode"), api_key_env=None, tokens=4)
    assert r.ok and r.near_tie and r.first_mismatch == 3
    assert "near tie at token 3" in r.reason


def test_no_kv_bytes_counted_fails_even_with_right_tokens(stub: Stub) -> None:
    stub.kv_per_run = 0.0
    r = check_pair(stub.worker("prefill"), stub.worker("decode"), api_key_env=None, tokens=4, settle=0.5)
    assert not r.ok and "moved no KV bytes" in r.reason


def test_a_send_counted_after_the_decode_answered_still_counts(stub: Stub) -> None:
    """The prefill counts its send at the decode's acknowledgement, which can land after the decode
    answered (an embedded prefill on starved cores): the first read after the run shows nothing."""
    stub.count_after_reads = 3
    r = check_pair(stub.worker("prefill"), stub.worker("decode"), api_key_env=None, tokens=4)
    assert r.ok, r.reason
    assert r.kv_bytes == pytest.approx(0.25 * 1024 * 1024)


def test_a_dead_decode_is_an_error_with_its_name(stub: Stub) -> None:
    dead = Worker("decode-9", "http://127.0.0.1:9", role="decode")
    r = check_pair(stub.worker("prefill"), dead, api_key_env=None, tokens=4, timeout=5)
    assert not r.ok and r.reason.startswith("decode decode-9: HTTP 0")


def test_encoder_counts_parse_sglangs_series() -> None:
    assert encoder_counts((FIX / "metrics_encoder.txt").read_text()) == (7.0, 19.0)
    assert encoder_counts((FIX / "metrics_prefill_kv.txt").read_text()) is None


def test_kv_counter_falls_back_to_the_embedded_series() -> None:
    text = "epd_prefill_transport_bytes_sent_total 4096\n"
    srv_text = {"body": text}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_GET(self) -> None:
            data = srv_text["body"].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        got = token_canary.kv_counters(f"http://127.0.0.1:{srv.server_address[1]}", None)
        assert got == (4096.0, None, "epd_transport_bytes_sent_total")
        srv_text["body"] = "some_other_total 1\n"
        assert token_canary.kv_counters(f"http://127.0.0.1:{srv.server_address[1]}", None) == (None, None, None)
    finally:
        srv.shutdown()


def test_check_canary_takes_the_engine_from_the_state_not_from_command_lines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A vLLM cluster is refused by its recorded engine, whatever its argv looks like."""
    from click.testing import CliRunner

    from epdctl.cli import cli
    from epdctl.state.store import ClusterDir, ClusterState, ProcessRecord

    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path))
    ClusterDir("v").save(ClusterState(name="v", topology="t.yaml", launcher="local",
                                      engine="vllm", processes=[ProcessRecord(
                                          "prefill-0", "prefill", "n",
                                          argv=["python", "-m", "sglang.launch_server"])]))
    out = CliRunner().invoke(cli, ["check", "--canary", "v"])
    assert out.exit_code != 0 and "runs vllm" in (out.output + str(out.exception))
