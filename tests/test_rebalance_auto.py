"""The --auto policy (pure): synthetic metric sequences in, proposals out; it never flaps."""

from __future__ import annotations

from epdctl.rebalance.auto import AutoState, Policy, Proposal, Sample, decide, pressure

COUNTS = {"encoder": 1, "prefill": 1, "decode": 2}


def run(policy: Policy, samples: list[Sample]) -> list[tuple[float, Proposal]]:
    st, out = AutoState(), []
    for s in samples:
        prop, st = decide(policy, st, s)
        if prop is not None:
            out.append((s.t, prop))
    return out


def sample(t: float, enc: float, pre: float = 0.0, dec: float = 0.0, counts: dict | None = None,
           ttft: float | None = None) -> Sample:
    return Sample(t=t, counts=dict(counts or COUNTS),
                  queue={"encoder": enc, "prefill": pre, "decode": dec}, ttft=ttft)


def test_sustained_encoder_queue_moves_one_idle_decode_after_sustain_samples() -> None:
    pol = Policy(high=4, low=0.5, sustain=3, cooldown=60)
    moves = run(pol, [sample(t, enc=10) for t in range(0, 10)])
    assert moves[0] == (2, Proposal("encoder", "decode", moves[0][1].reason))
    assert len(moves) == 1  # cool-down: no second move within 60 s


def test_a_spike_shorter_than_sustain_does_nothing() -> None:
    pol = Policy(sustain=3)
    seq = [sample(0, 10), sample(1, 10), sample(2, 0), sample(3, 10), sample(4, 10), sample(5, 0)]
    assert run(pol, seq) == []


def test_oscillating_load_never_flaps() -> None:
    """Encoder-heavy then decode-heavy every 2 samples: neither pair is sustained for 3."""
    pol = Policy(sustain=3, cooldown=0)
    seq = []
    for t in range(40):
        heavy_enc = (t // 2) % 2 == 0
        seq.append(sample(t, enc=12 if heavy_enc else 0, dec=0 if heavy_enc else 20,
                          counts={"encoder": 2, "prefill": 1, "decode": 2}))
    assert run(pol, seq) == []


def test_cooldown_spaces_moves_and_then_allows_the_next() -> None:
    pol = Policy(sustain=2, cooldown=30)
    seq = [sample(t, enc=10, counts={"encoder": 1, "prefill": 1, "decode": 4}) for t in range(0, 80, 5)]
    times = [t for t, _ in run(pol, seq)]
    assert times and all(b - a >= 30 for a, b in zip(times, times[1:])) and len(times) >= 2


def test_no_donor_means_no_move_and_the_last_worker_is_never_taken() -> None:
    pol = Policy(sustain=1)
    # decode is short, the encoder/prefill are idle but each is the last of its role
    assert run(pol, [sample(t, enc=0, dec=50, counts={"encoder": 1, "prefill": 1, "decode": 1})
                     for t in range(5)]) == []
    # a busy donor is not a donor either (hysteresis band between low and high)
    assert run(pol, [sample(t, enc=10, dec=3, counts={"encoder": 1, "prefill": 1, "decode": 2})
                     for t in range(5)]) == []


def test_ttft_over_target_raises_the_busier_front_stage() -> None:
    pol = Policy(high=4, low=0.5, ttft_target=1.0, sustain=2)
    s = sample(0, enc=2, pre=0, ttft=3.0)
    assert pressure(pol, s)["encoder"] == 3.0
    moves = run(pol, [sample(t, enc=2, ttft=3.0) for t in range(3)])
    assert moves and moves[0][1].target == "encoder" and moves[0][1].source == "decode"


def test_recovery_resets_the_streak() -> None:
    pol = Policy(sustain=3)
    st = AutoState()
    for t, enc in enumerate([10, 10, 0]):
        _, st = decide(pol, st, sample(t, enc))
    assert st.streak == 0 and st.candidate is None


def test_auto_options_are_checked_before_anything_is_read() -> None:
    from click.testing import CliRunner

    from epdctl.cli import cli as main

    r = CliRunner().invoke(main, ["rebalance", "--auto", "--window", "-1"])
    assert r.exit_code == 2 and "--window" in r.output and "Traceback" not in r.output
    help_text = CliRunner().invoke(main, ["rebalance", "--help"]).output
    for opt in ("--busy-high", "--busy-low", "--window", "--log-json"):
        assert opt in help_text
