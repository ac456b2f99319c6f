"""gcpause: the startup heap is frozen once a worker serves, and every collection is timed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import gc, json
    from epdctl.runtime.fast import gcpause
    from epdctl.runtime.metrics import Registry

    startup = [[i] for i in range(200_000)]           # what a worker loads and keeps (lists: tracked)
    frozen = gcpause.freeze_startup_heap()
    before = gcpause.PAUSES.count
    gc.disable()                                      # so the cycles below wait for the one collect
    for i in range(50_000):                           # what requests allocate: cycles to collect
        a = {}; b = {"a": a}; a["b"] = b
    gc.enable()
    collected = gc.collect()
    m = Registry("epd_test", process=False)
    gcpause.metrics(m)
    print(json.dumps({"frozen": frozen, "freeze_count": gc.get_freeze_count(), "collected": collected,
                      "pauses": gcpause.PAUSES.count - before, "total": gcpause.PAUSES.total,
                      "longest": gcpause.PAUSES.longest, "again": gcpause.freeze_startup_heap() >= frozen,
                      "callbacks": gc.callbacks.count(gcpause.PAUSES), "metrics": m.render()}))
""")


def test_freeze_keeps_the_startup_heap_out_of_collections_and_times_them():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    import json

    got = json.loads(out.stdout)
    assert got["frozen"] >= 200_000 and got["freeze_count"] >= got["frozen"]
    assert got["collected"] >= 99_000             # the request-time cycles were still collected
    assert got["pauses"] >= 1 and 0.0 < got["longest"] <= got["total"]
    assert got["again"] and got["callbacks"] == 1  # freezing twice registers the timer once
    text = got["metrics"]
    for name in ("epd_test_gc_pauses_total", "epd_test_gc_pause_seconds_total", "epd_test_gc_pause_longest_seconds",
                 "epd_test_gc_frozen_objects"):
        assert f"\n{name} " in "\n" + text, name
