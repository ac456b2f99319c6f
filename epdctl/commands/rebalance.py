"""`epdctl rebalance` (live role reassignment) and `epdctl history` (its audit trail)."""

from __future__ import annotations

import datetime as _dt
import json
import time
from typing import Any

import click

from epdctl.errors import EpdctlError, Reported, StateError
from epdctl.orchestrate.prometheus_sd import kept_current
from epdctl.state.store import ClusterDir, ClusterState, resolve_cluster
from epdctl.topology.model import Topology


def _cluster(arg: str | None) -> tuple[ClusterDir, ClusterState]:
    from epdctl.commands.args import cluster_arg as _cluster_arg

    cdir = resolve_cluster(_cluster_arg(arg))
    state = cdir.load()
    if state is None:
        raise StateError(f"cluster {cdir.name!r} is not recorded; start it with `epdctl up`")
    if state.phase != "running":
        raise StateError(f"cluster {cdir.name!r} is {state.phase}, not running; wait for `up` "
                         "to finish (or check `epdctl status`)")
    return cdir, state


def _print_plan(rp: Any) -> None:
    from epdctl.engines import engine_of
    from epdctl.rebalance.plan import commands_diff, topology_diff

    click.echo("moves, in order:")
    for i, m in enumerate(rp.moves, 1):
        click.echo(f"  {i}. {m.worker} ({m.old_role}) -> {m.new_name} ({m.new_role}) on "
                   f"{','.join(m.nodes)}, port {m.port}")
        click.echo(f"     path: {m.path} ({m.why})")
    click.echo("\ntopology:")
    for ln in topology_diff(rp):
        click.secho(ln, fg="green" if ln.startswith("+") else "red" if ln.startswith("-")
                    else None)
    click.echo("\nrendered commands:")
    for ln in commands_diff(rp):
        click.secho(ln, fg="green" if ln.startswith("+") else "red" if ln.startswith("-")
                    else None)
    if engine_of(rp.before).routed_encoders:
        click.echo("\nonly the moved workers restart: the router takes them through its /workers")
    else:
        click.echo("\nprefills are not restarted: their encoder list changes live through their "
                   "encoder registries")


def _on_step(step: Any) -> None:
    if step.detail == "ok":
        click.echo(f"  [{step.move}] {step.step:<8} {step.seconds:6.2f}s")
    elif step.step == "rollback" and step.detail:
        click.secho(f"  [{step.move}] ROLLBACK: {step.detail}", fg="yellow")
    elif step.step == "fallback":
        click.secho(f"  [{step.move}] {step.detail}", fg="yellow")
    elif step.step == "done":
        click.secho(f"  [{step.move}] done in {step.seconds:.1f}s", fg="green")


def _execute(cdir: ClusterDir, rp: Any, request: dict[str, Any], opts: Any) -> dict[str, Any]:
    """Run the plan under the cluster lock with the cluster's own launcher."""
    from epdctl.launchers import get_launcher
    from epdctl.rebalance.execute import Executor

    with cdir.lock("rebalance"), kept_current(cdir):
        state = cdir.load()
        if state is None:
            raise StateError(f"cluster {cdir.name!r} was stopped while the rebalance was planned")
        launcher = get_launcher(state.launcher, cdir.root, rp.before)
        try:
            return Executor(rp, cdir, state, launcher, opts, on_step=_on_step).run(request)
        finally:
            launcher.close()


def _report(rec: dict[str, Any]) -> None:
    colour = {"done": "green", "rolled_back": "yellow"}.get(rec["outcome"], "red")
    click.secho(f"rebalance {rec['id']}: {rec['outcome']}", fg=colour)
    for m in rec["moves"]:
        if m.get("taken"):
            click.echo(f"  {m['move']['worker']} -> {m['move']['new_name']}: {m['taken']}, "
                       f"{sum(m['steps'].values()):.1f}s")
        if m["error"]:
            click.echo(f"  {m['move']['worker']} -> {m['move']['new_name']}: {m['outcome']} "
                       f"({m['error']})")
    if rec["outcome"] != "done":
        raise Reported()


@click.command()
@click.argument("cluster", required=False)
@click.option("--encoder", "d_encoder", default=None, help="Change in encoders, e.g. +2.")
@click.option("--prefill", "d_prefill", default=None, help="Change in prefills, e.g. -1.")
@click.option("--decode", "d_decode", default=None, help="Change in decodes, e.g. -1.")
@click.option("--from", "source", type=click.Choice(["encoder", "prefill", "decode"]),
              default=None, help="Role that gives up the workers the others gain.")
@click.option("--dry-run", is_flag=True, help="Show the plan, change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--drain-timeout", type=float, default=120.0, show_default=True,
              help="Seconds a worker may take to finish its in-flight requests.")
@click.option("--timeout", type=float, default=300.0, show_default=True,
              help="Seconds a worker may take to become healthy in its new role.")
@click.option("--no-verify", is_flag=True, help="Skip the post-move link check (canary).")
@click.option("--restart", "force_restart", is_flag=True,
              help="Restart moved workers even where they could switch role in place.")
@click.option("--auto", "auto", is_flag=True, help="Run the policy loop instead.")
@click.option("--apply", "auto_apply", is_flag=True, help="--auto: apply moves (else propose).")
@click.option("--interval", type=float, default=5.0, show_default=True, help="--auto: seconds.")
@click.option("--iterations", type=int, default=0, help="--auto: stop after N samples (0: never).")
@click.option("--window", type=click.FloatRange(min=0), default=15.0, show_default=True,
              help="--auto: seconds each utilisation is averaged over (0: since the last sample).")
@click.option("--sustain", type=int, default=3, show_default=True,
              help="--auto: samples in a row that must agree before a move.")
@click.option("--cooldown", type=float, default=120.0, show_default=True,
              help="--auto: seconds after a move with no further move.")
@click.option("--queue-high", type=float, default=4.0, show_default=True,
              help="--auto: per-worker queue that makes a role short.")
@click.option("--queue-low", type=float, default=0.5, show_default=True,
              help="--auto: per-worker queue at which a role may give a worker.")
@click.option("--busy-high", type=float, default=0.8, show_default=True,
              help="--auto: per-worker utilisation (busy s per s) that makes a role short.")
@click.option("--busy-low", type=float, default=0.3, show_default=True,
              help="--auto: per-worker utilisation at which a role may give a worker.")
@click.option("--ttft-target", type=float, default=None, help="--auto: TTFT target (s).")
@click.option("--log-json", "log_json", type=click.Path(dir_okay=False), default=None,
              help="--auto: append every sample and decision to this file, one JSON line each.")
def rebalance(cluster: str | None, d_encoder: str | None, d_prefill: str | None,
              d_decode: str | None, source: str | None, dry_run: bool, yes: bool,
              drain_timeout: float, timeout: float, no_verify: bool, force_restart: bool,
              auto: bool,
              auto_apply: bool, interval: float, iterations: int, window: float, sustain: int,
              cooldown: float, queue_high: float, queue_low: float, busy_high: float,
              busy_low: float, ttft_target: float | None, log_json: str | None) -> None:
    """Move workers of a running CLUSTER between roles without dropping requests.

    Example: `epdctl rebalance --encoder +1 --from decode`. Each moved worker is drained,
    switched in place (workers started switchable, rebalance.in_place) or restarted in its new
    role, re-registered and link-checked; a failed start rolls back.
    """
    from epdctl.rebalance.current import current_topology
    from epdctl.rebalance.execute import Options
    from epdctl.rebalance.plan import force_restart as restart_all
    from epdctl.rebalance.plan import parse_delta, plan_rebalance

    cdir, state = _cluster(cluster)
    if any(p.handle is not None and p.handle.job and p.handle.step is None
           for p in state.processes):
        raise EpdctlError(f"cluster {state.name!r} was started as one SLURM batch job by an "
                          "older epdctl, which cannot restart a single worker; `epdctl down` it "
                          "and `epdctl up` it again to rebalance it")
    topo = current_topology(cdir, state)
    opts = Options(model=state.model, api_key_env=state.api_key_env,
                   ready_timeout=timeout, drain_timeout=drain_timeout, verify=not no_verify)
    if auto:
        from epdctl.rebalance.auto import Policy

        policy = Policy(high=queue_high, low=queue_low, ttft_target=ttft_target,
                        sustain=sustain, cooldown=cooldown, busy_high=busy_high,
                        busy_low=busy_low)
        _auto_loop(cdir, policy, opts, auto_apply, interval, iterations, log_json, window)
        return
    deltas = {"encoder": parse_delta(d_encoder, "--encoder"),
              "prefill": parse_delta(d_prefill, "--prefill"),
              "decode": parse_delta(d_decode, "--decode")}
    rp = plan_rebalance(topo, deltas, source)
    if force_restart:
        rp = restart_all(rp)
    _print_plan(rp)
    if dry_run:
        click.echo("\n(dry run: nothing changed)")
        return
    if not yes and not click.confirm(f"\napply {len(rp.moves)} move(s) to cluster "
                                     f"{state.name}?", default=False):
        raise click.exceptions.Abort()
    request = {"deltas": {k: v for k, v in deltas.items() if v}, "from": source,
               **({"restart": True} if force_restart else {})}
    _report(_execute(cdir, rp, request, opts))


def _auto_loop(cdir: ClusterDir, policy: Any, opts: Any, apply: bool, interval: float,
               iterations: int, log_json: str | None = None, window: float = 0.0) -> None:
    from epdctl.rebalance.auto import AutoState, decide
    from epdctl.rebalance.current import current_topology
    from epdctl.rebalance.signals import Collector
    from epdctl.render import build_plan

    st, n = AutoState(), 0
    click.echo(f"auto-rebalance of {cdir.name}: sample every {interval:.0f}s, "
               f"{'applying' if apply else 'proposing'} moves (Ctrl-C to stop)")
    collector: Collector | None = None
    while iterations <= 0 or n < iterations:
        n += 1
        state = cdir.load()
        if state is None:
            raise EpdctlError(f"cluster {cdir.name!r} is no longer recorded (stopped?)")
        topo = current_topology(cdir, state)
        plan = build_plan(topo)
        if collector is None:
            prom = (f"http://{plan.router.host}:{plan.router.prometheus_port}"
                    if plan.router else None)
            collector = Collector(prom, window=window, api_key_env=state.api_key_env)
        sample = collector.sample(time.time(), plan.workers)
        prop, st = decide(policy, st, sample)
        q = " ".join(f"{r}={sample.counts[r]}w/{sample.queue[r]:.0f}q"
                     + (f"/{sample.util[r]:.2f}busy" if r in sample.util else "")
                     for r in sample.counts)
        click.echo(f"{time.strftime('%H:%M:%S')} {q} streak={st.streak}")
        outcome = None
        if prop is not None:
            click.secho(f"  proposal: +1 {prop.target} from {prop.source} ({prop.reason})",
                        fg="cyan")
            if apply:
                outcome = _apply(cdir, topo, prop, opts)
        if log_json:
            _log_sample(log_json, sample, st, prop, outcome)
        if iterations <= 0 or n < iterations:
            time.sleep(interval)


def _apply(cdir: ClusterDir, topo: Topology, prop: Any, opts: Any) -> str:
    """Run one proposal as `rebalance +1 --from`; its outcome, or why it was not applied."""
    from epdctl.rebalance.plan import plan_rebalance

    try:
        rp = plan_rebalance(topo, {prop.target: 1}, prop.source)
        rec = _execute(cdir, rp, {"deltas": {prop.target: 1}, "from": prop.source,
                                  "auto": True, "reason": prop.reason}, opts)
    except EpdctlError as e:
        click.secho(f"  not applied: {e}", fg="yellow")
        return f"not applied: {e}"
    click.echo(f"  applied: {rec['outcome']}")
    return str(rec["outcome"])


def _log_sample(path: str, sample: Any, st: Any, prop: Any, outcome: str | None) -> None:
    from dataclasses import asdict

    doc = {**asdict(sample), "streak": st.streak,
           "proposal": asdict(prop) if prop is not None else None, "outcome": outcome}
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(doc, sort_keys=True) + "\n")
    except OSError as e:
        raise EpdctlError(f"--log-json {path}: cannot write: {e.strerror or e}") from None


@click.command()
@click.argument("cluster", required=False)
@click.option("--json", "as_json", is_flag=True, help="One JSON record per line.")
def history(cluster: str | None, as_json: bool) -> None:
    """Every rebalance of CLUSTER: who, when, what moved, outcome and step durations."""
    from epdctl.commands.args import cluster_arg as _cluster_arg
    from epdctl.rebalance import history as hist

    name = _cluster_arg(cluster)
    cdir = ClusterDir(name) if name else resolve_cluster(None)
    records = hist.read(cdir.root)
    if as_json:
        for rec in records:
            click.echo(json.dumps(rec, sort_keys=True))
        return
    if not records:
        click.echo(f"cluster {cdir.name!r}: no rebalance recorded")
        return
    for rec in records:
        when = _dt.datetime.fromtimestamp(rec.get("started", 0), _dt.timezone.utc)
        took = float(rec.get("finished", 0)) - float(rec.get("started", 0))
        req = " ".join(f"--{k} {v:+d}" for k, v in (rec.get("request", {}).get("deltas") or {}
                                                    ).items())
        src = rec.get("request", {}).get("from")
        click.echo(f"{when:%Y-%m-%d %H:%M:%S}Z  {rec.get('id')}  {rec.get('who')}  "
                   f"{req}{f' --from {src}' if src else ''}  -> {rec.get('outcome')} "
                   f"({took:.1f}s)")
        for m in rec.get("moves", []):
            mv = m["move"]
            steps = " ".join(f"{k}={v:.2f}s" for k, v in m.get("steps", {}).items())
            click.echo(f"    {mv['worker']} ({mv['old_role']}) -> {mv['new_name']} "
                       f"({mv['new_role']}): {m['outcome']}  {steps}")
            if m.get("error"):
                click.echo(f"      error: {m['error']}")
