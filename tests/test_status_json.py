"""`epdctl status --json` keeps the documented shape (docs/status.schema.json): the schema names every
field the view has, and views of healthy, dead and figure-less clusters validate against it. The e2e
tests validate every real `status --json` they read too (tests/e2e/conftest.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema

from epdctl.orchestrate.observe import ClusterView, WorkerView
from epdctl.http.probes import Load

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "docs" / "status.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def _worker(name: str, role: str, **kw: object) -> WorkerView:
    base = dict(name=name, role=role, node="n0", pid=10, url="http://127.0.0.1:1", alive=True, uptime_s=3.5,
                health="ok", healthy=True)
    return WorkerView(**{**base, **kw})  # type: ignore[arg-type]


def _view() -> ClusterView:
    samples = {'epd_decode_requests_total{status="200"}': 3.0, 'epd_decode_ttft_seconds_bucket{le="0.1"}': 3.0,
               'epd_decode_ttft_seconds_bucket{le="+Inf"}': 3.0}
    return ClusterView(name="c", topology="/t.yaml", phase="running", launcher="local", workers=[
        _worker("encoder-0", "encoder", load=Load(1, 0, None), metrics={}),
        _worker("decode-0", "decode", metrics=samples, figures={"requests": 3.0, "ttft_p50_ms": 50.0,
                                                               "ttft_p99_ms": 99.0, "tpot_p50_ms": None,
                                                               "cache_hit_rate": None, "bytes_sent": None}),
        _worker("prefill-0", "prefill", alive=False, uptime_s=None, health="dead", healthy=False,
                log_tail="Traceback ..."),
        _worker("router", "router", router="ready"),
    ], router_ready=True, router_detail="", router_figures={"requests": 3.0, "ttft_p50_ms": None})


def test_schema_lists_every_view_field() -> None:
    worker_fields = {f.name for f in dataclasses.fields(WorkerView)} - {"metrics"}  # metrics is never shown
    assert set(SCHEMA["properties"]["workers"]["items"]["properties"]) == worker_fields
    view_fields = {f.name for f in dataclasses.fields(ClusterView)} | {"figures", "summary", "healthy"}
    assert set(SCHEMA["properties"]) == view_fields
    assert set(SCHEMA["properties"]["workers"]["items"]["properties"]["load"]["properties"]) == {
        f.name for f in dataclasses.fields(Load)}


def test_views_validate() -> None:
    view = _view()
    doc = json.loads(json.dumps(view.to_dict()))
    VALIDATOR.validate(doc)
    assert doc["healthy"] is False and doc["summary"]["prefill"] == {"ready": 0, "total": 1}
    empty = ClusterView(name="c", topology="/t.yaml", phase="starting", launcher="ssh")
    VALIDATOR.validate(json.loads(json.dumps(empty.to_dict())))


def test_a_new_key_breaks_the_contract() -> None:
    doc = json.loads(json.dumps(_view().to_dict()))
    doc["workers"][0]["surprise"] = 1
    assert not VALIDATOR.is_valid(doc)
