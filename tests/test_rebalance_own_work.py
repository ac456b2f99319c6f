"""Which series `rebalance --auto` reads as a role's own work, on every engine's /metrics page.

SGLang cannot run here (no GPU), so its pages are fixtures whose names, types and labels come
from SGLang 0.5.23's source (each file's header); the first test reads that source (installed
with the engine parsers) and checks every SGLang series the policy reads is declared there.
The embedded runtime's page is rendered by its own code.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from epdctl.http import metrics
from epdctl.rebalance.own_work import ROLE_BUSY, ROLE_QUEUE, busy_seconds, own_queue
from epdctl.runtime.metrics import Registry
from epdctl.runtime.servers.busy import own_work_metrics

FIX = Path(__file__).resolve().parent / "fixtures" / "sglang"


def _page(name: str) -> dict[str, float]:
    return metrics.parse((FIX / name).read_text())


def _sglang_src() -> Path:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.origin, ("SGLang's source is not installed: run scripts/setup.sh with "
                                              "EPDCTL_SETUP_SGLANG=1 (scripts/test.sh does)")
    return Path(spec.origin).parent / "srt"


def test_every_sglang_series_read_is_declared_in_sglangs_source() -> None:
    src = _sglang_src()
    declared = set(re.findall(r'name="(sglang:[a-z_]+)"',
                              (src / "observability" / "metrics_collector.py").read_text()))
    names = {n for role in ROLE_BUSY.values() for n in role}
    names |= {n for role in ROLE_QUEUE.values() for group in role for n in group}
    read = {re.sub(r"_sum$", "", n) for n in names if n.startswith("sglang:")}
    assert read and read <= declared, read - declared
    # the forward-time counter's "idle" category (left out) and the switch that enables it
    assert 'device_timer_ctx(model_runner.device_timer, "idle")' in (
        src / "model_executor" / "runner" / "eager_runner.py").read_text()
    assert "SGLANG_ENABLE_METRICS_DEVICE_TIMER" in (src / "environ.py").read_text()


def test_sglang_decode_own_work_is_forward_time_and_its_own_queues_per_scheduler() -> None:
    page = _page("metrics_own_work_decode.txt")
    # two data-parallel schedulers: (30 decode + 1 extend, idle filler left out) and 26, averaged
    assert busy_seconds(page, "decode") == pytest.approx(28.5)
    # waiting queue (3, 1) + prealloc (2, 0), averaged; the 9 + 7 in KV transfer are not its own
    assert own_queue(page, "decode") == pytest.approx(3.0)
    assert busy_seconds(page, "prefill") == pytest.approx(28.5)  # same series on a prefill
    assert own_queue(page, "prefill") == pytest.approx(2.0)      # no prealloc queue there
    assert busy_seconds(page, "encoder") is None and own_queue(page, "encoder") is None


def test_sglang_encoder_busy_time_is_its_vit_forward_time_over_modalities() -> None:
    page = _page("metrics_own_work_encoder.txt")
    assert busy_seconds(page, "encoder") == pytest.approx(15.0)
    assert own_queue(page, "encoder") is None  # SGLang has no encoder queue gauge: fall back
    assert busy_seconds(page, "decode") is None


def test_embedded_page_rendered_by_the_runtime() -> None:
    reg = Registry("epd_prefill")
    own_work_metrics(reg, lambda: 4.25, lambda: 2)
    page = metrics.parse(reg.render())
    assert busy_seconds(page, "prefill") == 4.25 and own_queue(page, "prefill") == 2.0
    assert busy_seconds(page, "decode") is None  # another role's series are not this role's


def test_a_page_without_own_work_series_gives_nothing() -> None:
    page = _page("metrics_prefill_kv.txt")  # SGLang without the device timer or queues shown
    assert busy_seconds(page, "prefill") is None and own_queue(page, "prefill") is None
