"""kill -9 of one worker under load, judged the same way on every launcher.

A client thread (``Load`` from test_restart_local: real image requests through smg with the
openai client, back to back) runs the whole time. The worker process itself (not its
supervisor) is killed with SIGKILL; the supervisor restarts it; the service must come back with
no operator: the first request started after the kill that succeeds marks "service back", and
every request started after that must succeed. ``pid_file`` reads the supervisor's pid file
wherever the launcher keeps it (the node's run folder over SSH, the shared run folder on SLURM).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable

from test_restart_local import Load

AFTER = 5   # requests that must succeed after the service is back


@dataclass
class Outcome:
    outage_s: float                 # kill -> start of the first later request that succeeded
    failed_between: int             # requests started in between that failed
    pid_doc: dict[str, Any]         # the supervisor's pid file after the restart


def kill_under_load(router_url: str, pid_file: Callable[[], dict[str, Any]],
                    deadline_s: float = 75.0) -> Outcome:
    """Kill the worker behind ``pid_file`` under load; wait for the restart and the service."""
    with Load(router_url) as load:
        end = time.monotonic() + deadline_s
        while not any(ok for _, ok, _ in load.outcomes) and time.monotonic() < end:
            time.sleep(0.2)
        assert any(ok for _, ok, _ in load.outcomes), load.outcomes[-3:]
        before = pid_file()
        while before.get("state") != "running" and time.monotonic() < end:
            time.sleep(0.2)  # the supervisor probes health once a second
            before = pid_file()
        assert before.get("state") == "running", before
        t_kill = time.monotonic()
        os.kill(int(before["child_pid"]), signal.SIGKILL)
        now = before
        while time.monotonic() < end:
            now = pid_file()
            if now.get("restarts") == before["restarts"] + 1 and now.get("state") == "running":
                break
            time.sleep(0.2)
        assert now.get("restarts") == before["restarts"] + 1 and now["state"] == "running", now
        back = None
        while back is None and time.monotonic() < end:
            back = next((t for t, ok, _ in list(load.outcomes) if ok and t > t_kill), None)
            time.sleep(0.2)
        assert back is not None, [o for o in load.outcomes if o[0] > t_kill][-3:]
        while sum(t > back for t, _, _ in list(load.outcomes)) < AFTER and time.monotonic() < end:
            time.sleep(0.2)
    after = [o for o in load.outcomes if o[0] > back]
    assert len(after) >= AFTER and all(ok for _, ok, _ in after), [o for o in after if not o[1]]
    failed = [o for o in load.outcomes if t_kill < o[0] < back and not o[1]]
    return Outcome(back - t_kill, len(failed), now)
