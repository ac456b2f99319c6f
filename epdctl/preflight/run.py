"""One `check` run: collect facts on every node in parallel, judge them, measure the links.

Returns a ``CheckReport`` (data, no printing) that the command renders as a table or JSON.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

from epdctl.launchers.ssh.fanout import fanout
from epdctl.preflight import links as links_mod
from epdctl.preflight import perftest_links, targets
from epdctl.preflight.links import LinkResult
from epdctl.preflight.container_checks import check_containers
from epdctl.preflight.engine_version import engine_items
from epdctl.preflight.node_checks import CheckItem, Facts, check_node, check_versions
from epdctl.preflight.runners import NodeRunner
from epdctl.preflight.store_check import store_items
from epdctl.topology.model import Topology
from epdctl.render.plan import Plan

FACTS_TIMEOUT = 90.0
log = logging.getLogger(__name__)


@dataclass
class CheckReport:
    items: list[CheckItem] = field(default_factory=list)
    links: list[LinkResult] = field(default_factory=list)
    links_checked: bool = False
    strict: bool = False            # a warning fails the check too
    facts: list[Facts] = field(default_factory=list)  # what each reachable node reported
    images: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> image -> its id there

    def failed(self, i: CheckItem) -> bool:
        return not i.ok or (self.strict and i.status == "warn")

    @property
    def ok(self) -> bool:
        return not any(self.failed(i) for i in self.items) and all(r.ok for r in self.links)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "strict": self.strict,
                "warnings": sum(i.status == "warn" for i in self.items),
                "checks": [i.to_json() for i in self.items],
                "links": [r.to_json() for r in self.links] if self.links_checked else None}


def collect_facts(runner: NodeRunner, model_path: str | None) -> Facts | CheckItem:
    """Run ``agent facts`` on the node; a failure becomes one failing item for that node."""
    argv = [runner.python, *links_mod.AGENT, "facts"]
    if model_path:
        argv += ["--model-path", model_path]
    try:
        res = runner.run(argv, timeout=FACTS_TIMEOUT)
    except Exception as e:  # noqa: BLE001 - an unreachable node is a finding, not a crash
        return CheckItem(runner.node, "reach node", False, str(e))
    doc = None
    for line in reversed(res.stdout.strip().splitlines()):
        try:
            doc = json.loads(line)
            break
        except ValueError:
            continue
    if res.rc != 0 or not isinstance(doc, dict) or "probes" not in doc:
        err = (res.stderr.strip().splitlines() or [res.stdout.strip() or "no output"])[-1]
        return CheckItem(runner.node, "agent", False,
                         f"`{runner.python} -m epdctl.node.preflight_agent facts` failed (exit {res.rc}):"
                         f" {err}; is the same epdctl installed on the node?")
    return Facts(runner.node, doc["probes"], doc.get("versions", {}), doc.get("path_exists", {}))


def run_check(topo: Topology, runners: Mapping[str, NodeRunner], *, plan: Plan | None = None,
              links: bool = False, threshold: float = links_mod.DEFAULT_THRESHOLD,
              seconds: float = 0.5, agent_port: int = links_mod.DEFAULT_AGENT_PORT,
              connect_timeout: float = 3.0, min_disk_gb: float = 1.0,
              strict: bool = False) -> CheckReport:
    expect = targets.expectations(topo, plan, min_disk_gb=min_disk_gb)
    nodes = list(expect)
    report = CheckReport(links_checked=links, strict=strict)
    got = fanout({n: runners[n] for n in nodes},
                 lambda n, r: collect_facts(r, expect[n].model_path))
    facts: list[Facts] = []
    for name in nodes:
        f = got.ok.get(name) or CheckItem(name, "reach node", False, str(got.failed.get(name)))
        if isinstance(f, CheckItem):
            report.items.append(f)
            continue
        facts.append(f)
        try:
            report.items += check_node(expect[name], f)
        except Exception as e:  # noqa: BLE001 - one node's surprise never hides the others
            log.debug("[%s] node checks raised", name, exc_info=True)
            report.items.append(CheckItem(name, "node checks", False,
                                          f"unexpected error judging this node ({type(e).__name__}:"
                                          f" {e}); the other nodes were judged"))
    report.items += check_versions(facts, targets.version_keys(topo))
    runnable = {n: runners[n] for n in nodes if n in runners}
    report.items += engine_items(topo, runnable)
    report.items += store_items(topo, runnable, min_free_gb=min_disk_gb)
    probes = targets.container_probes(topo, plan)
    reached = {f.node for f in facts}
    boxed = fanout({n: runners[n] for n in nodes if n in probes and n in reached},
                   lambda n, r: check_containers(probes[n], r))
    for name in nodes:
        if name in boxed.ok:
            report.items += boxed.ok[name][0]
            if boxed.ok[name][1]:
                report.images[name] = boxed.ok[name][1]
        elif name in boxed.failed:
            report.items.append(CheckItem(name, "container checks", False, str(boxed.failed[name])))
    report.facts = facts
    if links:
        eps = {n: targets.endpoints(topo, n) for n in nodes}
        pairs = links_mod.link_pairs(targets.placements(topo, plan), eps)
        report.links = links_mod.measure(
            pairs, runners, transport=targets.transport_of(topo), seconds=seconds,
            threshold=threshold, agent_port=agent_port, connect_timeout=connect_timeout)
        report.items += perftest_links.measure_pairs(
            pairs, runners, {f.node: f for f in facts}, port=agent_port + 100,
            threshold=threshold)
    return report
