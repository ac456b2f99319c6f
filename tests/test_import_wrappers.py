"""Wrapper launchers' own flags: `python -m dynamo.sglang` takes Dynamo's runtime and wrapper flags
(epdctl/topology/flags/dynamo_sglang.json, copied from Dynamo's argparse groups) beside SGLang's.
Import keeps them, labels them as the wrapper's, and the topology validates; the same flags on a
plain SGLang worker are refused."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from epdctl.engines import engine_for
from epdctl.engines.wrappers import WRAPPERS
from epdctl.errors import TopologyError
from epdctl.importer import import_scripts
from epdctl.importer.roundtrip import compare, load, summary
from epdctl.topology import topology_from_text

FIXTURES = Path(__file__).parent / "fixtures"
QUICKSTART = FIXTURES / "wrapper_sets" / "dynamo-docs-quickstart.sh"
PR_19746 = FIXTURES / "launch_sets" / "sglang-pr-19746-dynamo-prefill.sh"


def test_wrapper_table_names_its_sources_and_has_no_engine_flags() -> None:
    doc = json.loads(resources.files("epdctl.topology").joinpath("flags", "dynamo_sglang.json").read_text())
    assert doc["wrapper"] == "Dynamo" and doc["module"] == "dynamo.sglang"
    assert all("ai-dynamo/dynamo" in s for s in doc["sources"])
    flags = {f for o in doc["options"] for f in o["flags"]}
    assert {"--request-plane", "--discovery-backend", "--event-plane", "--dump-config-to", "--migration-limit",
            "--use-sglang-tokenizer", "--no-use-sglang-tokenizer"} <= flags
    sglang = engine_for("sglang").flags()
    assert not [f for f in flags if sglang.resolve(f) is not None and f in sglang.options], "engine's own flags"
    assert set(WRAPPERS) == {"dynamo.sglang"}


@pytest.mark.parametrize("path,kept", [(QUICKSTART, "--discovery-backend file"),
                                       (PR_19746, "--dump-config-to /scratch")])
def test_wrapper_flags_are_kept_and_labelled(path: Path, kept: str) -> None:
    draft, text, _ = import_scripts([str(path)])
    assert any("wrapper flags of Dynamo (dynamo.sglang)" in n and kept in n for n in draft.notes), draft.notes
    assert "# wrapper flags of Dynamo (dynamo.sglang), kept:" in text
    topo, problems = load(text)
    assert not [p for p in problems if "flag" in p], problems  # no flag is reported unknown
    matched, total, wiring = summary(compare(draft, text))
    assert matched == total and wiring
    (w,) = [w for w in topo.workers]
    assert w.settings.module == "dynamo.sglang" and kept.split(" ")[0] in w.settings.args


def test_request_plane_validates_on_a_dynamo_worker_and_choices_are_checked() -> None:
    base = ("name: t\nengine: sglang\nmodel: {path: m}\nnodes: [{name: n, host: 127.0.0.1, gpus: 1}]\n"
            "roles:\n  colocated:\n    workers:\n      - node: n\n        module: dynamo.sglang\n"
            "        args: [--request-plane, {plane}, --use-sglang-tokenizer, --enable-metrics-for-all-schedulers]\n")
    topology_from_text(base.replace("{plane}", "nats"))
    with pytest.raises(TopologyError) as e:
        topology_from_text(base.replace("{plane}", "carrier-pigeon"))
    assert "--request-plane 'carrier-pigeon' is not one of: tcp, nats, http" in str(e.value)


def test_wrapper_flag_on_a_plain_sglang_worker_is_refused() -> None:
    text = ("name: t\nengine: sglang\nmodel: {path: m}\nnodes: [{name: n, host: 127.0.0.1, gpus: 1}]\n"
            "roles:\n  colocated:\n    workers:\n      - node: n\n        args: [--request-plane, tcp]\n")
    with pytest.raises(TopologyError) as e:
        topology_from_text(text)
    msg = str(e.value)
    assert "--request-plane is not a sglang 0.5.23 flag" in msg
    wrapped = engine_for("sglang").flags(None, "dynamo.sglang")
    assert "nor a Dynamo (dynamo.sglang) flag" in wrapped.unknown("--request-plan-x")
    assert wrapped.owner("--request-plane") == "Dynamo (dynamo.sglang)" and wrapped.owner("--tp-size") is None
