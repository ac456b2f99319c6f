"""`epdctl up / status / down / logs`: start a cluster, look after it, stop it."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import click

from epdctl.errors import EpdctlError, LaunchError, Reported
from epdctl.launchers import get_launcher, names as launcher_names
from epdctl.orchestrate import stores
from epdctl.orchestrate.lifecycle import BringUp
from epdctl.orchestrate.observe import observe
from epdctl.orchestrate.prometheus_sd import kept_current, key_hint, register as register_sd
from epdctl.state.store import ClusterDir, ClusterState, list_clusters, resolve_cluster, state_root
from epdctl.topology.schema import LAUNCHERS

from epdctl.commands.args import cluster_arg as _cluster_arg, complete_cluster
from epdctl.commands.lock import planned_lock, refuse_unless_locked, write_lock
from epdctl.commands.preflight_gate import preflight_before_up
from epdctl.commands.render_status import Progress, job_line, render_status
from epdctl.render.plan import Plan


_SD_HELP = ("Write Prometheus file_sd targets (every worker and the router, labels cluster/role/worker/node) "
            "to this file and keep it current as the cluster changes.")


def _load_plan(path: Path) -> tuple[Any, Any]:
    from epdctl.render import build_plan
    from epdctl.topology import load_topology, require_artifacts

    topo = load_topology(path)
    require_artifacts(topo, path)
    return topo, build_plan(topo)


def _check_ports_free(plan: Plan) -> None:
    """Fail before starting anything if a planned port is taken (clearer than a worker log)."""
    busy = []
    procs = [*plan.workers, *([plan.router] if plan.router else [])]
    for p in procs:
        for label, port in p.ports.items():
            what = "port" if label == "http" else f"{label.replace('_', ' ')} port"
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((p.host, int(port)))
                except OSError:
                    busy.append(f"  [{p.name}] {what} {p.host}:{port}")
    if busy:
        raise LaunchError("ports already in use (another cluster or program holds them):\n"
                          + "\n".join(busy) + "\nstop it (`epdctl down`) or change the "
                          "topology's ports")


def _staged(topo: Any, plan: Any, path: Path, launcher: Any, run_dir: Path) -> tuple[Any, Any]:
    """The weights where the engines read them (`epdctl stage`), the plan rebuilt when the
    download told which snapshot the engines get."""
    from epdctl.commands.stage import StagePrinter, run_stage
    from epdctl.render import build_plan

    staged = run_stage(topo, path, launcher, run_dir, StagePrinter())
    return (staged, build_plan(staged)) if staged is not topo else (topo, plan)


def _refuse_if_running(cdir: ClusterDir, launcher: Any) -> None:
    old = cdir.load()
    if old is None:
        return
    polled = launcher.poll(old.processes)
    alive = [n for n, st in polled.ok.items() if st.alive] + list(polled.failed)
    if alive:
        raise LaunchError(
            f"cluster {cdir.name!r} is already running ({len(alive)} of "
            f"{len(old.processes)} processes alive or unreachable: {', '.join(alive)}); see "
            f"`epdctl status {cdir.name}`, or stop it with `epdctl down {cdir.name}` first")
    click.echo(f"note: cluster {cdir.name!r} was recorded but none of its processes is "
               "alive; starting afresh")
    launcher.release()
    cdir.clear()


@click.command()
@click.argument("topology", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--launcher", "launcher_name", type=click.Choice(LAUNCHERS), default=None,
              help="How to start workers (default: the topology's launcher).")
@click.option("--no-canary", is_flag=True, help="Skip the post-launch test request.")
@click.option("--no-check", is_flag=True,
              help="Skip the topology's answer check (`check: {answers: FILE}`).")
@click.option("--timeout", type=click.FloatRange(min=1), default=None,
              help="Seconds every process may take to become healthy (every role starts at "
                   "once). Default: per role, the topology's `startup: {timeout: S}`, else "
                   "scaled with the weights' size.")
@click.option("--accept-new-host-keys", is_flag=True,
              help="ssh launcher: trust and record the host keys of nodes never seen before "
                   "(check their fingerprints first); a changed key is always refused.")
@click.option("--force", is_flag=True,
              help="Launch even when a node preflight check fails (the failures are printed).")
@click.option("--skip-preflight", is_flag=True,
              help="Do not run the node preflight (`epdctl check TOPOLOGY`) before launching.")
@click.option("--prometheus-sd", "prometheus_sd", type=click.Path(dir_okay=False, path_type=Path),
              help=_SD_HELP)
@click.option("--no-stage", is_flag=True,
              help="Do not download an hf: model or copy it to model.stage first (`epdctl stage` does).")
@click.option("--lock", "lock_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also copy the run's epdctl.lock (versions, image, model, commands, node "
                   "facts; always written into the run folder) to this file.")
@click.option("--locked", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Refuse to start, printing the difference, when anything would differ from "
                   "this lock.")
def up(topology: Path, launcher_name: str | None, no_canary: bool, no_check: bool, timeout: float | None,
       accept_new_host_keys: bool, force: bool, skip_preflight: bool, prometheus_sd: Path | None,
       lock_out: Path | None, locked: Path | None, no_stage: bool) -> None:
    """Preflight TOPOLOGY's nodes, start every worker and the router at once, wait for all,
    then run a canary."""
    topo, plan = _load_plan(topology)
    name = launcher_name or getattr(topo, "launcher", None) or "local"
    if name not in launcher_names():
        raise LaunchError(f"`epdctl up` cannot use launcher {name!r}; available: "
                          f"{', '.join(launcher_names())}")
    if topo.check is not None and not no_check:
        from epdctl.answers.questions import load as load_answers

        load_answers(topo.check.answers)  # a bad answers file stops `up` before it starts anything
    cdir = ClusterDir(topo.name)
    api_key_env = plan.router.api_key_env if plan.router else None
    if api_key_env and not os.environ.get(api_key_env):
        raise LaunchError(f"the router's API key variable {api_key_env} (router.api_key_env in "
                          f"{topology}) is not set; export it before `epdctl up`")
    from epdctl.orchestrate.startup import budgets, describe

    limits = ({p.name: timeout for p in (*plan.workers, *([plan.router] if plan.router else []))}
              if timeout is not None else budgets(topo, plan))
    launcher = get_launcher(name, cdir.root, topo, accept_new_host_keys)
    if hasattr(launcher, "wait_limit"):  # the budget also bounds a batch job's wait in the queue
        launcher.wait_limit = timeout if timeout is not None else max(limits.values())
    held: list[str] = []
    if hasattr(launcher, "announce"):  # the scheduler's job id, for squeue / scancel / sacct
        def announce(job: str, owned: bool) -> None:
            if held[-1:] != [job]:
                click.echo(job_line(job, owned))
            held.append(job)
        launcher.announce = announce
    try:
        with cdir.lock("up"), kept_current(cdir):
            _refuse_if_running(cdir, launcher)
            if not no_stage:
                topo, plan = _staged(topo, plan, topology, launcher, cdir.root)
            elif launcher.runs_here:
                from epdctl.stage import require_staged_here

                require_staged_here(topo, topology)
            report = preflight_before_up(topo, plan, launcher, force=force, skip=skip_preflight)
            lock_doc = planned_lock(topo, plan, report, cdir.root)
            if locked is not None:
                refuse_unless_locked(lock_doc, locked)
            if launcher.runs_here:
                _check_ports_free(plan)
            state = ClusterState(name=topo.name, topology=str(topology.resolve()),
                                 launcher=name, engine=topo.engine, api_key_env=api_key_env,
                                 model=topo.model.served_name,
                                 stores={n: list(d) for n, d in plan.stores.items()})
            if prometheus_sd is not None:
                register_sd(cdir, prometheus_sd, state)
                if hint := key_hint(state):
                    click.echo(hint, err=True)
            cdir.save(state)
            # on the nodes, the way the launcher runs programs there (SLURM: a step of the
            # allocation, obtained here when `up` has none yet)
            stores.prepare(launcher, plan.stores)
            click.echo(f"cluster {topo.name}: {len(plan.workers)} workers"
                       f"{' + router' if plan.router else ''}; logs in {cdir.log_dir}")
            if timeout is None:
                click.echo(describe(topo, limits))
            t0 = time.monotonic()
            bring = BringUp(launcher, cdir, state, timeout=max(limits.values()),
                            on_event=Progress(), timeouts=limits)
            bring.run(plan)
            plan_run = bring.plan or plan  # SLURM: the allocated nodes' addresses, not the plan's
            lock_path = write_lock(lock_doc, cdir.root, lock_out)
    finally:
        launcher.close()
    plan = plan_run
    click.secho(f"cluster {topo.name} is up in {time.monotonic() - t0:.1f}s", fg="green")
    click.echo(f"  lock: {lock_path}" + (f" (copied to {lock_out})" if lock_out else ""))
    if held:
        click.echo(f"  SLURM job: {held[-1]}  (squeue -j {held[-1]}; sacct -j {held[-1]})")
    if plan.router:
        click.echo(f"  OpenAI endpoint: {plan.router.url}/v1  (model {topo.model.served_name})")
    if plan.router is None:
        return
    if not no_canary:
        from epdctl.commands.canary import run_up_canary

        run_up_canary(plan, topo, api_key_env)
    if topo.check is not None and not no_check:
        from epdctl.commands.answers import run_up_answers

        run_up_answers(plan.router.url, topo, api_key_env)
    click.secho(f"cluster {topo.name} is ready", fg="green")


@click.command()
@click.argument("cluster", required=False, shell_complete=complete_cluster)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds until Ctrl-C.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True)
@click.option("-n", "--lines", type=click.IntRange(min=0), default=10, show_default=True,
              help="Log lines shown for a dead worker.")
@click.option("--prometheus-sd", "prometheus_sd", type=click.Path(dir_okay=False, path_type=Path),
              help=_SD_HELP)
def status(cluster: str | None, as_json: bool, watch: bool, interval: float,
           lines: int, prometheus_sd: Path | None) -> None:
    """Show every worker of CLUSTER (name or topology file): process, health, load, router.

    Exits 1 when a worker is dead or unhealthy (useful in scripts).
    """
    cdir = resolve_cluster(_cluster_arg(cluster))
    while True:
        state = cdir.load()
        if state is None:
            raise EpdctlError(f"cluster {cdir.name!r} is no longer recorded (stopped?)")
        if prometheus_sd is not None:
            n = register_sd(cdir, prometheus_sd, state)
            click.echo(f"wrote {n} Prometheus target(s) to {prometheus_sd} (kept current by up/rebalance/down)",
                       err=True)
            if hint := key_hint(state):
                click.echo(hint, err=True)
            prometheus_sd = None
        launcher = get_launcher(state.launcher, cdir.root)
        try:
            view = observe(state, launcher, tail_lines=lines)
        finally:
            launcher.close()
        if state.phase == "starting" and cdir.lock_holder() is None:
            view.phase = "failed"
            view.problem = (f"`epdctl up` ended before the cluster was ready (killed?); "
                            f"`epdctl down {state.name}` stops what it started")
        if as_json:
            click.echo(json.dumps(view.to_dict(), indent=2))
        else:
            if watch:
                click.clear()
            click.echo(render_status(view))
        if not watch:
            break
        time.sleep(interval)
    if not view.healthy:
        raise Reported()


def _log_dir_cluster(name: str | None) -> ClusterDir:
    """A cluster whose logs exist, even after `down` forgot its state."""
    if name:
        cdir = ClusterDir(name)
        if not cdir.log_dir.is_dir():
            raise EpdctlError(f"no logs recorded for cluster {name!r} under {cdir.root}")
        return cdir
    try:
        return resolve_cluster(None)
    except EpdctlError:
        base = state_root() / "clusters"
        found = sorted(p.name for p in base.glob("*") if (p / "logs").is_dir())
        if len(found) == 1:
            return ClusterDir(found[0])
        raise


@click.command()
@click.argument("worker", required=False)
@click.option("-c", "--cluster", default=None, help="Cluster name (if several are recorded).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until Ctrl-C.")
@click.option("-n", "--lines", type=click.IntRange(min=0), default=40, show_default=True)
def logs(worker: str | None, cluster: str | None, follow: bool, lines: int) -> None:
    """Print the log of WORKER (e.g. prefill-0, router), or the tail of every log."""
    from epdctl.launchers.base import tail

    cdir = _log_dir_cluster(_cluster_arg(cluster))
    state = cdir.load()
    if state is not None:
        _live_logs(cdir, state, worker, follow, lines)
        return
    available = sorted(p.stem for p in cdir.log_dir.glob("*.log"))
    if worker is not None and worker not in available:
        raise EpdctlError(f"no log for worker {worker!r} in cluster {cdir.name!r}; "
                          f"known: {', '.join(available) or 'none'}")
    chosen = [worker] if worker else available
    prefix = len(chosen) > 1
    for w in chosen:
        text = tail(cdir.log(w), lines)
        for ln in text.splitlines():
            click.echo(f"[{w}] {ln}" if prefix else ln)
    if follow:
        _follow({w: cdir.log(w) for w in chosen}, prefix)


def _live_logs(cdir: ClusterDir, state: ClusterState, worker: str | None, follow: bool,
               lines: int) -> None:
    """Logs of a recorded cluster, read where its launcher writes them (ssh: on the nodes)."""
    recs = {p.name: p for p in state.processes}
    if worker is not None and worker not in recs:
        raise EpdctlError(f"no worker {worker!r} in cluster {state.name!r}; "
                          f"known: {', '.join(recs) or 'none'}")
    chosen = [worker] if worker else list(recs)
    launcher = get_launcher(state.launcher, cdir.root)
    if follow and len(chosen) > 1 and not launcher.runs_here:
        raise EpdctlError(f"--follow on a {state.launcher} cluster follows one worker: name it "
                          f"(one of {', '.join(recs)})")
    prefix = len(chosen) > 1
    unread: list[str] = []
    try:
        for w in chosen:
            try:
                text = launcher.logs(recs[w], lines)
            except LaunchError as e:  # one unreachable node never hides the other logs
                unread.append(f"[{w}] {str(e).splitlines()[0]}")
                continue
            for ln in text.splitlines():
                click.echo(f"[{w}] {ln}" if prefix else ln)
        if unread:
            raise LaunchError("could not read every log:\n  " + "\n  ".join(unread))
        if follow and len(chosen) == 1:
            for ln in launcher.follow(recs[chosen[0]]):
                click.echo(ln)
        elif follow:
            _follow({w: Path(recs[w].log) for w in chosen}, prefix)
    finally:
        launcher.close()


def _follow(paths: dict[str, Path], prefix: bool) -> None:
    pos = {w: p.stat().st_size if p.exists() else 0 for w, p in paths.items()}
    while True:
        for w, p in paths.items():
            try:
                with open(p, "rb") as f:
                    f.seek(pos[w])
                    chunk = f.read()
            except FileNotFoundError:
                continue
            if chunk:
                pos[w] += len(chunk)
                for ln in chunk.decode(errors="replace").splitlines():
                    click.echo(f"[{w}] {ln}" if prefix else ln)
        time.sleep(0.3)
