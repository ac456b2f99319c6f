"""The per-pair canary's verdicts and views (the live behaviour is in
tests/e2e/test_check_canary.py): a pair passes only with bytes on both ends and, for P->D, a
right answer; the failing pair is named with its reason."""

from __future__ import annotations

from epdctl.canary.view import missing_transfers, render_deltas, render_pairs
from epdctl.canary.pairs import PairReport, PairResult


def test_pair_verdicts() -> None:
    assert PairResult("P->D", "prefill-0", "decode-0", 10, 10, 1, 1).ok
    assert not PairResult("P->D", "prefill-0", "decode-0", 10, 10, 4, 0).ok  # never right
    assert PairResult("E->P", "encoder-0", "prefill-0", 10, 5, 1, 0).ok     # no answer of its own
    dead = PairResult("E->P", "encoder-1", "prefill-0", 0, 0, 2)
    assert not dead.ok and dead.reason == "encoder-1 sent no bytes over its transport"
    deaf = PairResult("P->D", "prefill-0", "decode-1", 10, 0, 4, 0, last_error="HTTP 0 refused")
    assert "decode-1 received no bytes" in deaf.reason
    assert not PairReport().ok  # no pair measured is not a pass


def test_table_names_the_failing_pair() -> None:
    rep = PairReport([PairResult("P->D", "prefill-0", "decode-0", 4096, 4096, 1, 1),
                      PairResult("E->P", "encoder-1", "prefill-0", 0, 0, 2)])
    text = render_pairs(rep, "demo")
    ok_row = next(ln for ln in text.splitlines() if ln.startswith("P->D"))
    assert "prefill-0->decode-0" in ok_row and "4.0 KiB" in ok_row and ok_row.endswith("ok")
    bad_row = next(ln for ln in text.splitlines() if ln.startswith("E->P"))
    assert "FAIL" in bad_row and "encoder-1 sent no bytes" in bad_row
    assert text.endswith("1 pair(s) failed: encoder-1->prefill-0")
    doc = rep.to_json()
    assert doc["ok"] is False and doc["pairs"][1]["pair"] == "encoder-1->prefill-0"


def test_up_canary_deltas() -> None:
    roles = {"encoder-0": "encoder", "encoder-1": "encoder", "prefill-0": "prefill",
             "decode-0": "decode"}
    moved = {"encoder-0": (2048.0, 0.0), "encoder-1": (0.0, 0.0),
             "prefill-0": (100.0, 2048.0), "decode-0": (0.0, 100.0)}
    line = render_deltas(moved, roles)
    assert "encoder-0 sent 2.0 KiB" in line and "encoder-1" not in line
    assert "decode-0 received 100 B" in line and missing_transfers(moved, roles) == []
    none = {**moved, "encoder-0": (0.0, 0.0), "decode-0": (0.0, 0.0)}
    assert missing_transfers(none, roles) == ["no encoder sent embedding bytes",
                                              "no decode received KV bytes"]
    assert missing_transfers({"encoder-0": None}, roles) == []  # unreadable is not "zero"


def test_up_canary_deltas_say_what_came_inline() -> None:
    """byte_deltas' 4-tuples: totals, then the inline part (the embedded runtime's small embeddings)."""
    roles = {"encoder-0": "encoder", "encoder-1": "encoder", "prefill-0": "prefill", "decode-0": "decode"}
    moved = {"encoder-0": (2048.0, 0.0, 2048.0, 0.0), "encoder-1": (4096.0, 0.0, 1024.0, 0.0),
             "prefill-0": (100.0, 3072.0, 0.0, 2048.0), "decode-0": (0.0, 100.0, 0.0, 0.0)}
    line = render_deltas(moved, roles)
    assert "encoder-0 sent 2.0 KiB (all inline)" in line
    assert "encoder-1 sent 4.0 KiB (1.0 KiB inline)" in line
    assert "prefill-0 received 3.0 KiB (2.0 KiB inline), sent 100 B" in line
    assert "decode-0 received 100 B;" not in line and line.endswith("decode-0 received 100 B")
    assert missing_transfers(moved, roles) == []
