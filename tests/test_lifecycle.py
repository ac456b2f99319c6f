"""Bring-up, status, canary and down of a hand-built plan: dummy HTTP workers + the real smg.

The workers are `tests/e2e/dummy_worker.py` (real processes, real HTTP); the router is smg
from the venv, started through `python -m epdctl.node.router_exec` with an API key taken from an env
var, at the same time as the workers, and filled through `POST /workers` as each becomes
healthy. The full cluster with the real runtime is in tests/e2e/.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from epdctl.cli import cli
from epdctl.errors import LaunchError
from epdctl.orchestrate.lifecycle import BringUp, tear_down
from epdctl.render.plan import ROUTER_TYPES, ProcessSpec
from epdctl.render.router import HEALTH_FLAGS, registers_workers
from epdctl.topology.model import Role
from epdctl.launchers.local import LocalLauncher
from epdctl.orchestrate.observe import observe
from epdctl.canary import run_canary
from epdctl.http.routerctl import RouterClient
from epdctl.state.store import ClusterDir, ClusterState

DUMMY = str(Path(__file__).parent / "e2e" / "dummy_worker.py")
KEY_ENV = "EPDCTL_TEST_ROUTER_KEY"


def W(name: str, role: str, port: int, argv: tuple[str, ...], bootstrap_port: int | None = None,
      node: str = "local", host: str = "127.0.0.1", health_path: str = "/health", is_leader: bool = True,
      env: dict[str, str] | None = None) -> ProcessSpec:
    ports = {"http": port, **({"bootstrap": bootstrap_port} if bootstrap_port is not None else {})}
    return ProcessSpec(name=name, role=Role(role), node=node, host=host, url=f"http://{host}:{port}", ports=ports,
                       argv=argv, env=dict(env or {}), worker=name, is_leader=is_leader, health_path=health_path,
                       router_type=ROUTER_TYPES.get(Role(role)) if is_leader else None)


def R(port: int, prometheus_port: int, argv: tuple[str, ...], api_key_env: str | None = KEY_ENV,
      node: str = "local", host: str = "127.0.0.1", env: dict[str, str] | None = None,
      health_path: str = "/health") -> ProcessSpec:
    return ProcessSpec(name="router", role=Role.ROUTER, node=node, host=host, url=f"http://{host}:{port}",
                       ports={"http": port, "prometheus": prometheus_port}, argv=argv, env=dict(env or {}),
                       worker="router", health_path=health_path, registers_workers=registers_workers(argv),
                       key_vars=(api_key_env,) if api_key_env else (), prometheus_host=host,
                       api_key_env=api_key_env)


@dataclass
class Plan:
    workers: list[ProcessSpec]
    router: ProcessSpec | None


def _worker(name: str, role: str, port: int, *extra: str, boot: int | None = None) -> W:
    argv = ("python", DUMMY, str(port), role, *extra)
    if boot:
        argv += ("--bootstrap-port", str(boot))
    return W(name, role, port, argv, bootstrap_port=boot)


def _plan(base: int, *, bad: str | None = None) -> Plan:
    workers = [
        _worker("encoder-0", "encoder", base + 1),
        _worker("prefill-0", "prefill", base + 2, boot=base + 3),
        _worker("decode-0", "decode", base + 4, *(["--exit-at-start", bad] if bad else [])),
    ]
    flags = [x for kv in HEALTH_FLAGS.items() for x in kv]
    router = R(base, base + 90, ("python", "-m", "epdctl.node.router_exec", KEY_ENV, "smg.launch_router",
                                 "--pd-disaggregation", "--host", "127.0.0.1",
                                 "--port", str(base), "--prometheus-host", "127.0.0.1",
                                 "--prometheus-port", str(base + 90), *flags))
    return Plan(workers, router)


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv(KEY_ENV, "t0p-s3cret")
    return tmp_path / "state"


def _new(name: str) -> tuple[ClusterDir, ClusterState]:
    cdir = ClusterDir(name)
    st = ClusterState(name=name, topology="hand-built", launcher="local",
                      api_key_env=KEY_ENV, model="dummy")
    cdir.save(st)
    return cdir, st


def _no_process_left(state: ClusterState) -> bool:
    lau = LocalLauncher()
    return not any(s.alive for s in lau.poll(state.processes).ok.values()) and not any(
        psutil.pid_exists(p.pid) and psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE
        for p in state.processes)


def test_full_cycle_with_real_router(state_dir: Path) -> None:
    plan = _plan(34100)
    cdir, st = _new("hand")
    events: list[str] = []
    lau = LocalLauncher()
    try:
        BringUp(lau, cdir, st, timeout=60,
                on_event=lambda e: events.append(f"{e.stage}:{e.kind}")).run(plan)
        # every role is started before any is waited for; the router is ready last
        starts = [i for i, e in enumerate(events) if e.endswith(":starting")]
        assert len(starts) == 4 and max(starts) < events.index("encoder:ready")
        assert events[-1] == "router:ready"
        saved = cdir.load()
        assert saved is not None and saved.phase == "running" and len(saved.processes) == 4
        assert all(p.router_id for p in saved.processes if p.role in ("prefill", "decode"))
        assert "t0p-s3cret" not in cdir.state_file.read_text()
        # the router runs the planned command (recorded as is); the key is on no command line
        router = saved.router
        assert router is not None and router.handle is not None
        assert router.argv == list(plan.router.argv)
        cmdline = Path(f"/proc/{router.handle.pid}/cmdline").read_bytes().decode()
        assert "t0p-s3cret" not in cmdline  # smg sets its title (setproctitle) after parsing

        view = observe(saved, lau)
        assert view.healthy and view.summary() == {
            "encoder": (1, 1), "prefill": (1, 1), "decode": (1, 1), "router": (1, 1)}
        rows = {w.name: w for w in view.workers}
        assert rows["prefill-0"].router == "ready" and rows["encoder-0"].router == "-"
        assert rows["decode-0"].load is not None and rows["decode-0"].load.waiting == 2

        res = run_canary(plan.router.url, api_key_env=KEY_ENV, seed=1)
        assert res.n_images == 3 and res.answer.startswith("Picture 1:")
        assert res.timings == {"encode_ms": 1.0, "prefill_ms": 2.0, "decode_ms": 3.0}
        assert res.correct == (res.named == 3)

        runner = CliRunner()
        out = runner.invoke(cli, ["status", "--json"])
        assert out.exit_code == 0, out.output
        doc = json.loads(out.output)
        assert doc["healthy"] and {w["name"] for w in doc["workers"]} == {
            "encoder-0", "prefill-0", "decode-0", "router"}
        text = runner.invoke(cli, ["status", "hand"]).output
        assert "decode    1/1 ready" in text and "router view: ready" in text

        # Kill the decode behind epdctl's back: status shows it dead, the router drops it.
        dec = saved.find("decode-0")
        assert dec is not None
        assert dec.handle is not None
        os.killpg(dec.handle.pgid, 9)
        client = RouterClient(plan.router.url, KEY_ENV)
        while client.readiness()[0]:
            time.sleep(0.2)
        out = runner.invoke(cli, ["status", "--json"])
        assert out.exit_code == 1
        rows = {w["name"]: w for w in json.loads(out.output)["workers"]}
        assert rows["decode-0"]["alive"] is False and rows["decode-0"]["health"] == "dead"
        assert "dummy decode ready" in rows["decode-0"]["log_tail"]
        assert rows["decode-0"]["router"] != "ready"
        text = runner.invoke(cli, ["status"]).output
        assert "DEAD" in text and "decode-0 is dead" in text and "decode    0/1" in text

        logs = runner.invoke(cli, ["logs", "prefill-0", "-n", "5"])
        assert logs.exit_code == 0 and "dummy prefill ready" in logs.output
        bad = runner.invoke(cli, ["logs", "nope"])
        assert bad.exit_code != 0
    finally:
        final = cdir.load() or st
        down = CliRunner().invoke(cli, ["down"])
    assert down.exit_code == 0, down.output
    assert "no recorded process remains" in down.output
    assert _no_process_left(final)
    again = CliRunner().invoke(cli, ["down", "hand"])
    assert again.exit_code == 0 and "nothing to stop" in again.output
    kept = CliRunner().invoke(cli, ["logs", "decode-0", "-c", "hand"])  # logs outlive `down`
    assert kept.exit_code == 0 and "dummy decode ready" in kept.output


def _late_decode_is_routed_after_up(base: int, name: str, static: bool) -> None:
    """`up` a plan whose second decode answers smg's probes 503 for 10 s (epdctl's get 200);
    after `up`, smg must list every prefill/decode worker healthy. ``static``: the router's
    command names the workers instead of epdctl registering them."""
    plan = _plan(base)
    plan.workers.append(_worker("decode-1", "decode", base + 5, "--router-unhealthy-for", "10"))
    if static:
        named = ("--prefill", f"http://127.0.0.1:{base + 2}", str(base + 3),
                 "--decode", f"http://127.0.0.1:{base + 4}", "--decode", f"http://127.0.0.1:{base + 5}")
        argv = plan.router.argv + named  # what render decides from the command it renders
        plan.router = replace(plan.router, argv=argv, registers_workers=registers_workers(argv))
    cdir, st = _new(name)
    lau = LocalLauncher()
    try:
        BringUp(lau, cdir, st, timeout=60).run(plan)
        client = RouterClient(plan.router.url, KEY_ENV)
        healthy = sorted(w.url for w in client.workers() if w.healthy)
        assert healthy == [f"http://127.0.0.1:{p}" for p in (base + 2, base + 4, base + 5)], healthy
    finally:
        tear_down(cdir.load() or st, lau)


def test_up_is_done_only_when_the_router_routes_to_every_worker(state_dir: Path) -> None:
    """smg's /readiness wants one healthy prefill and decode; a second decode that smg does not
    see healthy yet must hold `up` until smg lists it healthy, so a client right after `up`
    reaches every worker."""
    _late_decode_is_routed_after_up(34500, "late", static=False)


def test_up_waits_for_every_worker_a_static_router_command_names(state_dir: Path) -> None:
    """The same when the router's command names its workers (`--prefill URL PORT --decode URL`,
    as `render` writes for smg): smg activates each through its own job and reads ready with one
    decode, so `up` must count the healthy workers it lists (seen in CI: a test right after `up`
    found one of two decodes routed)."""
    _late_decode_is_routed_after_up(34150, "static", static=True)


def test_worker_dying_during_up_stops_everything(state_dir: Path) -> None:
    plan = _plan(34200, bad="port 34204 already in use")
    cdir, st = _new("broken")
    lau = LocalLauncher()
    with pytest.raises(LaunchError) as e:
        BringUp(lau, cdir, st, timeout=60).run(plan)
    msg = str(e.value)
    assert "[local/decode-0]" in msg and "port 34204 already in use" in msg
    assert "stopped the" in msg and "process(es) this run had started" in msg
    assert cdir.load() is None
    assert _no_process_left(st)
    assert {"encoder-0", "prefill-0"} <= {p.name for p in st.processes}  # were started, then stopped


def test_ctrl_c_during_up_stops_what_was_started(state_dir: Path) -> None:
    plan = _plan(34300)
    cdir, st = _new("interrupted")

    def interrupt(ev) -> None:
        if ev.stage == "prefill" and ev.kind == "ready":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        BringUp(LocalLauncher(), cdir, st, timeout=60, on_event=interrupt).run(plan)
    assert cdir.load() is None and _no_process_left(st) and len(st.processes) == 4


def test_tear_down_of_a_recorded_state_from_a_new_launcher(state_dir: Path) -> None:
    """`down` from another shell: a fresh launcher that did not start the processes."""
    plan = Plan(_plan(34400).workers[:1], None)
    cdir, st = _new("other-shell")
    BringUp(LocalLauncher(), cdir, st, timeout=60).run(plan)
    saved = cdir.load()
    assert saved is not None
    res, _ = tear_down(saved, LocalLauncher())
    assert res.all_ok and _no_process_left(saved)


def _local_topology(tmp_path: Path, base: int, **router: str) -> Path:
    """topologies/local.yaml with its ports moved to ``base`` (and router keys overridden)."""
    import yaml

    src = Path(__file__).resolve().parents[1] / "topologies" / "local.yaml"
    doc = yaml.safe_load(src.read_text())
    doc["ports"] = {"base": base, "limit": base + 99}
    doc["model"]["path"] = str((src.parent / doc["model"]["path"]).resolve())
    doc["router"].update(router)
    out = tmp_path / "local.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


def test_up_refuses_busy_ports_before_starting_anything(state_dir: Path, tmp_path: Path) -> None:
    import socket

    topo = _local_topology(tmp_path, 34700)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 34702))
        s.listen(1)
        out = CliRunner().invoke(cli, ["up", str(topo)])
    assert out.exit_code != 0
    assert "ports already in use" in str(out.exception) and "127.0.0.1:34702" in str(out.exception)
    assert ClusterDir("local").load() is None


def test_up_needs_the_router_key_variable(state_dir: Path, tmp_path: Path) -> None:
    topo = _local_topology(tmp_path, 34750, api_key_env="EPDCTL_TEST_UNSET_KEY")
    out = CliRunner().invoke(cli, ["up", str(topo)])
    assert out.exit_code != 0
    assert "EPDCTL_TEST_UNSET_KEY" in str(out.exception) and "not set" in str(out.exception)


def test_registration_needed_where_smg_drops_static_workers():
    from epdctl.render.router import registers_workers as needs_registration  # decided at render

    assert needs_registration(["py", "-m", "smg.launch_router", "--port", "5"])
    assert not needs_registration(["py", "-m", "smg.launch_router", "--prefill", "http://a:1", "9",
                                   "--decode", "http://a:2", "--enable-igw"])
    assert not needs_registration(["py", "-m", "smg.launch_router", "--worker-urls", "http://a:1"])
    # smg 1.13 with --enable-igw starts "Regular { worker_urls: [] }": epdctl registers them itself
    assert needs_registration(["py", "-m", "smg.launch_router", "--worker-urls", "http://a:1",
                               "--enable-igw"])
