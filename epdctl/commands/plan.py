"""`epdctl profile [CLUSTER]` and `epdctl plan TOPOLOGY`: measure per-role capacity, then size
Encoder:Prefill:Decode for a workload and SLOs from that measurement."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import yaml

from epdctl.engines import engine_of
from epdctl.errors import EpdctlError, Reported
from epdctl.topology.model import Topology


@click.command("profile")
@click.argument("cluster", required=False)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the profile JSON (default: CLUSTER_DIR/profile.json).")
@click.option("--batches", default="1,4,16", show_default=True,
              help="Decode batch sizes to measure.")
@click.option("--requests", type=int, default=4, show_default=True,
              help="Requests per encoder/prefill probe.")
@click.option("--output-tokens", type=int, default=32, show_default=True)
@click.option("--model", help="Model name (default: the cluster's).")
def profile(cluster: str | None, out: Path | None, batches: str, requests: int,
            output_tokens: int, model: str | None) -> None:
    """Measure one worker's capacity per role on a running CLUSTER (input of `epdctl plan`)."""
    from epdctl.bench.profile import measure
    from epdctl.bench.target import resolve

    try:
        bs = tuple(sorted({int(b) for b in batches.split(",") if b.strip()}))
    except ValueError:
        raise click.BadParameter(f"{batches!r}: expected batch sizes like 1,4,16") from None
    if not bs or min(bs) < 1 or requests < 1 or output_tokens < 2:
        raise click.BadParameter("batches must be >= 1, --requests >= 1, --output-tokens >= 2")
    resolved = resolve(cluster, model=model)
    if resolved.cluster_dir is None and out is None:
        raise click.BadParameter("profiling a URL needs --out FILE")
    click.echo(f"profiling {resolved.target.base_url} ({resolved.target.model})")
    doc = measure(resolved, batches=bs, requests=requests, output_tokens=output_tokens,
                  say=lambda m: click.echo("  " + m))
    path = out or (resolved.cluster_dir / "profile.json")  # type: ignore[operator]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    e, p, d = doc["encoder"], doc["prefill"], doc["decode"]
    click.echo(f"encoder: {e['images_per_s']:.1f} images/s per worker ({e['source']})")
    click.echo(f"prefill: {p['tokens_per_s']:.0f} prompt tokens/s + {p['overhead_ms']:.1f} ms "
               f"per request; {p['tokens_per_image']:.1f} tokens per image")
    click.echo("decode:  " + ", ".join(f"batch {b}: {t:.1f} tok/s (TPOT {d['tpot_ms'][b]:.1f} ms)"
                                       for b, t in d["tokens_per_s"].items()))
    click.echo(f"wrote {path}")


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise EpdctlError(f"cannot read {what} {path}: {e.strerror}") from None
    except ValueError as e:
        raise EpdctlError(f"{what} {path} is not JSON: {e}") from None


def _cost_per_worker(topo: Topology) -> tuple[dict[str, int], str]:
    """GPUs per worker of each role (from the topology); workers when the engine uses none."""
    from epdctl.topology.model import Role

    cost: dict[str, int] = {}
    for role in (Role.ENCODER, Role.PREFILL, Role.DECODE):
        ws = topo.role_workers(role)
        if not ws:
            raise EpdctlError(f"{topo.source}: no {role.value} workers; `epdctl plan` sizes "
                              "an encoder/prefill/decode topology (not a colocated one)")
        cost[role.value] = ws[0].settings.gpus
    if all(v <= 1 for v in cost.values()) and not engine_of(topo).uses_gpus:
        return {k: 1 for k in cost}, "workers"
    return {k: max(1, v) for k, v in cost.items()}, "GPUs"


def _shared_cores(topo: Topology) -> float | None:
    """This machine's cores when every worker of an embedded topology is on one shared node
    here (the planner's contention term); None when workers have their own accelerators."""
    import os

    nodes = {n for w in topo.workers for n in w.nodes}
    if engine_of(topo).uses_gpus or len(nodes) != 1:
        return None
    node = topo.node(next(iter(nodes)))
    local = node.host in ("127.0.0.1", "localhost", "::1") or node.host.startswith("127.")
    return float(os.cpu_count() or 1) if node.shared and local else None


def _same_total(counts: dict[str, int]) -> list[dict[str, int]]:
    """Every other E:P:D split (each >= 1) with the same number of workers."""
    total = sum(counts.values())
    out = [{"encoder": e, "prefill": p, "decode": total - e - p}
           for e in range(1, total - 1) for p in range(1, total - e)]
    return [s for s in out if s != counts]


def _split_arg(text: str) -> dict[str, int]:
    parts = text.split(":")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise click.BadParameter(f"{text!r}: expected E:P:D worker counts like 1:2:2",
                                 param_hint="--compare")
    return dict(zip(("encoder", "prefill", "decode"), map(int, parts)))


@click.command("plan")
@click.argument("topology", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--workload", "workload_file", required=True,
              type=click.Path(dir_okay=False, path_type=Path), help="Workload YAML.")
@click.option("--profile", "profile_file", required=True,
              type=click.Path(dir_okay=False, path_type=Path), help="`epdctl profile` JSON.")
@click.option("--gpus", type=int, help="GPU (or worker) budget.")
@click.option("--slo", help="Targets, e.g. ttft=500ms,tpot=50ms.")
@click.option("--max-util", type=float, default=0.85, show_default=True,
              help="Highest utilisation any role may run at.")
@click.option("--write", "write_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the topology with the recommended counts (peak hour) here.")
@click.option("--compare", multiple=True, metavar="E:P:D",
              help="Also predict this split at the peak rate (repeatable), e.g. 1:2:2.")
@click.option("--compare-all", is_flag=True,
              help="Also predict every other split with the recommended total.")
@click.option("--host-cores", type=float, default=None,
              help="Cores the workers share (default: this machine's when every worker of an "
                   "embedded topology is on one `shared: true` node; 0 = each has its own).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plan(topology: Path, workload_file: Path, profile_file: Path, gpus: int | None,
         slo: str | None, max_util: float, write_out: Path | None, compare: tuple[str, ...],
         compare_all: bool, host_cores: float | None, as_json: bool) -> None:
    """Recommend the Encoder:Prefill:Decode split for a workload from a measured profile."""
    from epdctl.bench import plan_io, planner
    from epdctl.bench.workload import load_workload
    from epdctl.topology import load_topology

    if not 0 < max_util <= 1:
        raise click.BadParameter("--max-util must be in (0, 1]")
    topo = load_topology(topology)
    cost, unit = _cost_per_worker(topo)
    w = load_workload(workload_file)
    prof = planner.Profile.from_dict(_read_json(profile_file, "profile"), str(profile_file))
    targets = plan_io.parse_slo(slo)
    rate = w.rate if w.rate is not None else (max(w.hours.values()) if w.hours else None)
    if rate is None:
        raise EpdctlError(f"{workload_file}: the planner needs a request rate (`rate:` or "
                          "`hours:`); a concurrency-only workload has no arrival rate")
    base = planner.Demand(rate, w.mean_images, w.repeat, w.prompt_tokens, w.max_tokens)
    cores = _shared_cores(topo) if host_cores is None else (host_cores or None)
    kw: dict[str, Any] = dict(gpus=gpus, cost_per=cost, max_util=max_util, unit=unit, host_cores=cores)
    hours = planner.recommend_hours(prof, base, w.hours, targets, **kw) if w.hours else {}
    peak_rate = max([rate, *w.hours.values()]) if w.hours else rate
    peak = planner.recommend(prof, replace(base, rate=peak_rate),
                             targets, **kw)
    splits = [_split_arg(c) for c in compare]
    if compare_all:
        splits += [s for s in _same_total(peak.split.counts) if s not in splits]
    others = [planner.evaluate(prof, peak.demand, s, cost, cores) for s in splits]
    from epdctl.topology.weights import switchable_memory
    in_place: list[str] = switchable_memory(topo)
    doc: dict[str, Any] = {"topology": str(topology), "workload": w.describe(), "host_cores": cores,
           "in_place_memory": in_place,
           "peak": peak.to_dict(),
           "hours": {str(h): r.to_dict() for h, r in hours.items()},
           "compare": [o.to_dict() for o in others]}
    if write_out and peak.feasible:
        src = yaml.safe_load(topology.read_text())
        mpath = (src.get("model") or {}).get("path")
        if isinstance(mpath, str) and mpath.startswith(("./", "../")):  # keep it findable
            src["model"]["path"] = str((topology.parent / mpath).resolve())
        new = plan_io.retopology(src, peak.split.counts)
        write_out.parent.mkdir(parents=True, exist_ok=True)
        write_out.write_text(f"# epdctl plan: E:P:D {peak.split.ratio()} for {w.describe()}\n"
                             + yaml.safe_dump(new, sort_keys=False))
        try:
            load_topology(write_out)
        except EpdctlError as e:
            raise EpdctlError(f"wrote {write_out}, but it does not validate (fix by hand, e.g. "
                              f"widen ports.limit):\n{e}") from None
        doc["written"] = str(write_out)
    if as_json:
        click.echo(json.dumps(doc, indent=1))
    else:
        click.echo(f"workload {w.describe()}")
        click.echo(f"peak {peak_rate:g} req/s" + (f", workers sharing {cores:g} cores:" if cores
                                                   else ":"))
        for line in peak.explain():
            click.echo("  " + line)
        for line in in_place:
            click.echo("  " + line)
        for o in others:
            click.echo(f"  compare {o.ratio()} ({o.cost} {unit}): predicted TTFT "
                       f"{o.ttft_ms:.1f} ms, TPOT {o.tpot_ms:.1f} ms; utilisation "
                       + ", ".join(f"{k} {v:.0%}" for k, v in o.utilisation.items()))
        for h, r in hours.items():
            s = r.split
            click.echo(f"  hour {h:02d} ({r.demand.rate:g} req/s): {s.ratio()} ({s.cost} {unit}), "
                       f"bottleneck {s.bottleneck}" + ("" if r.feasible else "  INFEASIBLE"))
        if "written" in doc:
            click.echo(f"wrote {write_out} (validated)")
        elif write_out:
            click.echo(f"not written: {write_out} (no feasible split)")
    if not peak.feasible:
        raise Reported()
