"""The ssh agent's process identity (epdctl/node/ssh_agent_procs.py) on this machine's
/proc: a record from the local state carries only ``create_time`` (btime + ticks), and btime
flips by a whole second when the clock is slewed, so a record written under the other btime
must still name its process (else `status` calls a live worker dead and `down` leaves it
running), while a record a few seconds off (a reused pid) still names nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Iterator

import pytest

from epdctl.node import ssh_agent_procs as ap

TOKEN = "t-" + os.urandom(8).hex()


@pytest.fixture
def leader() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                         env=dict(os.environ, EPDCTL_TOKEN=TOKEN))
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def _rec(p: subprocess.Popen[bytes], shift: float, token: str = TOKEN) -> dict[str, object]:
    """As the control plane sends it: the create_time it recorded, ``shift`` seconds off."""
    ticks = ap._stat(p.pid)[2]  # type: ignore[index]
    return {"name": "w", "pid": p.pid, "pgid": p.pid, "token": token,
            "create_time": ap._create_time(ticks) + shift}


@pytest.mark.parametrize("shift", [0.0, 1.0, -1.0])
def test_a_record_written_under_a_btime_one_second_off_still_names_its_process(
        leader: subprocess.Popen[bytes], shift: float) -> None:
    rec = _rec(leader, shift)
    assert ap._same(rec)
    assert ap._members(rec) == [leader.pid]


@pytest.mark.parametrize("shift", [3.0, -3.0, 100.0])
def test_a_record_seconds_off_names_nothing(leader: subprocess.Popen[bytes], shift: float) -> None:
    rec = _rec(leader, shift)
    assert not ap._same(rec) and ap._members(rec) == []


def test_the_token_is_still_required(leader: subprocess.Popen[bytes]) -> None:
    rec = _rec(leader, 0.0, token="t-somebody-else")
    assert not ap._same(rec) and ap._members(rec) == []


def test_records_made_on_the_node_compare_ticks_exactly(leader: subprocess.Popen[bytes]) -> None:
    ticks = ap._stat(leader.pid)[2]  # type: ignore[index]
    exact = {"name": "w", "pid": leader.pid, "pgid": leader.pid, "token": TOKEN, "start_ticks": ticks}
    assert ap._same(exact)
    assert not ap._same({**exact, "start_ticks": ticks + 1})
