"""The topology's ``limits:`` section: defaults equal the runtime's, set keys reach the runtime's
flags (parsed back by the runtime's own parser) and the router's body limit, bad values are
reported with their YAML path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from epdctl.errors import TopologyError
from epdctl.render import build_plan
from epdctl.runtime.__main__ import build_parser
from epdctl.runtime.limits import Limits as RuntimeLimits
from epdctl.runtime.limits import limits_from_args
from epdctl.topology import topology_from_text
from epdctl.topology.limits import DEFAULTS

ROOT = Path(__file__).resolve().parents[1]
LOCAL = yaml.safe_load((ROOT / "topologies" / "local.yaml").read_text())


def topo(**limits):
    doc = dict(LOCAL, limits=limits) if limits else dict(LOCAL)
    doc["router"] = dict(doc["router"], api_key_env="EPD_KEY")
    return topology_from_text(yaml.safe_dump(doc), ROOT / "topologies" / "local.yaml")


def test_defaults_equal_the_runtime_defaults():
    rt = RuntimeLimits()
    for key, value in DEFAULTS.items():
        assert getattr(rt, key.replace("_s", "") if key == "image_fetch_timeout_s" else key) == value, key


def test_set_limits_reach_every_role_and_the_router():
    t = topo(max_body_bytes=1_000_000, max_prompt_tokens=2048, max_image_pixels=1_000_000,
             max_request_pixels=3_000_000, max_images_per_request=4, image_fetch_hosts=["images.example.com"],
             image_fetch_timeout_s=2.5, max_image_bytes=500_000)
    plan = build_plan(t)
    seen = {}
    for spec in plan.workers:
        argv = list(spec.argv)
        i = argv.index("epdctl.runtime")
        args = build_parser().parse_args(argv[i + 1:])
        seen[spec.role] = limits_from_args(args)
        if spec.role in ("encoder", "prefill"):
            assert "--api-key-env" in argv and "EPD_KEY" in argv
    assert seen["prefill"] == RuntimeLimits(1_000_000, 2048, 500_000, 1_000_000, 3_000_000, 4,
                                            ("images.example.com",), 2.5)
    enc = seen["encoder"]
    assert (enc.max_image_pixels, enc.max_request_pixels, enc.max_images_per_request) == (1_000_000, 3_000_000, 4)
    assert enc.max_body_bytes >= 4 * 500_000 * 4 // 3  # fetched images reach it base64-encoded
    assert seen["decode"].max_body_bytes == 1_000_000
    router = list(plan.router.argv)
    assert router[router.index("--max-payload-size") + 1] == "1000000"


def test_unset_limits_render_nothing_but_the_router_body_limit():
    plan = build_plan(topo())
    for spec in plan.workers:
        assert not any(a.startswith("--max-") or a.startswith("--image-") for a in spec.argv), spec.argv
    router = list(plan.router.argv)
    assert router[router.index("--max-payload-size") + 1] == str(DEFAULTS["max_body_bytes"])


@pytest.mark.parametrize("limits,path,text", [
    ({"max_body_bytes": 0}, "limits.max_body_bytes", "at least 1"),
    ({"max_image_pixels": "lots"}, "limits.max_image_pixels", "expected an integer"),
    ({"image_fetch_hosts": ["evil.com; rm -rf /"]}, "limits.image_fetch_hosts", "not a host name"),
    ({"image_fetch_timeout_s": 0}, "limits.image_fetch_timeout_s", "(0, 600]"),
    ({"max_pixels": 5}, "limits.max_pixels", "did you mean"),
])
def test_bad_limits_are_reported_with_their_path(limits, path, text):
    with pytest.raises(TopologyError) as exc:
        topo(**limits)
    assert any(p.path == path and text in p.message for p in exc.value.problems), exc.value.problems
