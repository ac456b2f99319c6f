"""lab/benchmarks/ab_decode_step.py: each setting it times is the engine it names (torch's attention
or the C loop; one thread or the pool from --pool-rows rows), and an engine runs exactly the
steps the bench gives it."""

from __future__ import annotations

import pytest

import ab_decode_step as ab

from tiny_model import prefilled


@pytest.fixture(scope="module")
def results(bundle, images):
    return prefilled(bundle, images, 2)


@pytest.mark.parametrize("setting", ["torch", "native", "native+pool"])
def test_setting_is_the_engine_it_names(bundle, results, setting):
    eng = ab.engine(bundle, results, 2, 6, setting, pool_rows=2)
    assert (eng.native is None) == (setting == "torch")
    assert [eng.threads.wanted(n, 2) for n in (1, 2)] == ([1, 2] if setting == "native+pool" else [1, 1])
    assert eng.num_running == 2 and eng.forward_passes == 1  # past the join step
    for _ in range(6):
        assert len(eng.step()) == 2
    assert eng.num_running == 0  # the bench's turns never run an engine dry mid-turn


class _Counter:
    """A stand-in engine: counts its steps (the turn logic is what is under test)."""

    def __init__(self) -> None:
        self.done = 0

    def step(self) -> list:
        self.done += 1
        return []


def test_both_sides_time_the_same_positions_of_every_request():
    made: list[tuple] = []

    def fresh(key):
        made.append(key)
        return _Counter()

    wide, steps, block = 4, 12, 3
    keys = [("native", n, r) for n in (1, wide) for r in (range(wide) if n == 1 else [0])]
    wall, cpu, log = ab.run_turns(fresh, keys, ["native"], 2 * wide, block, steps, wide)
    pairs = list(zip(log[::2], log[1::2]))
    assert [one[0] for _, one in pairs] == [("native", 1, t % wide) for t in range(2 * wide)]  # requests in order
    assert all(many[0] == ("native", wide, 0) and one[1] == many[1] for many, one in pairs)  # same positions
    assert all(left < steps for _, left in log)  # every timed turn follows an untimed step of its engine
    assert all(len(wall[k]) == len(cpu[k]) == (2 * wide if k[1] == wide else 2) for k in keys)


def test_turn_ratios_pair_each_one_stream_turn_with_the_wide_turn_before_it():
    times = {("native", 4, 0): [2.0, 4.0, 2.0, 1.0], ("native", 1, 0): [1.0], ("native", 1, 1): [2.0],
             ("native", 1, 2): [3.0], ("native", 1, 3): [0.5]}
    assert ab.turn_ratios(times, "native", 4) == [4 * 1.0 / 2.0, 4 * 2.0 / 4.0, 4 * 3.0 / 2.0, 4 * 0.5 / 1.0]
