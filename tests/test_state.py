"""Cluster state: atomic writes, lock contention between processes, corrupt files."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from epdctl.errors import StateError
from epdctl.state.store import (
    ClusterDir, ClusterState, Handle, ProcessRecord, check_name, list_clusters, resolve_cluster,
)


def _record(name: str = "prefill-0", pid: int = 4242) -> ProcessRecord:
    return ProcessRecord(
        name=name, role="prefill", node="local", host="127.0.0.1", port=34001,
        url="http://127.0.0.1:34001", handle=Handle(pid=pid, pgid=pid, create_time=1.5),
        log="/tmp/x.log", since=2.5, argv=["python", "-m", "epdctl.runtime", "prefill"],
        bootstrap_port=34002, engine="embedded", node_rank=0, nnodes=2,
    )


def test_roundtrip_keeps_every_field(tmp_path: Path) -> None:
    cd = ClusterDir("demo", tmp_path)
    st = ClusterState(name="demo", topology="t.yaml", launcher="local", api_key_env="KEY",
                      processes=[_record(), _record("router", 77)])
    cd.save(st)
    back = cd.load()
    assert back == st
    assert back is not None and back.find("router") is not None


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    cd = ClusterDir("demo", tmp_path)
    for i in range(20):
        cd.save(ClusterState(name="demo", topology=f"t{i}.yaml", launcher="local"))
    assert sorted(p.name for p in cd.root.iterdir()) == ["state.json"]
    assert json.loads(cd.state_file.read_text())["topology"] == "t19.yaml"


def test_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    """A writer process rewrites a large state in a loop while this process reads it."""
    cd = ClusterDir("demo", tmp_path)
    cd.save(ClusterState(name="demo", topology="t.yaml", launcher="local"))
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from pathlib import Path
        from epdctl.state.store import ClusterDir, ClusterState, Handle, ProcessRecord
        cd = ClusterDir("demo", Path({str(tmp_path)!r}))
        recs = [ProcessRecord(name=f"w{{i}}", role="decode", node="n", host="h", port=i,
                url="u", handle=Handle(pid=i, pgid=i), log="l", since=0.0, argv=["x"] * 50)
                for i in range(300)]
        for _ in range(100):
            cd.save(ClusterState(name="demo", topology="t.yaml", launcher="local",
                                 processes=recs))
    """)])
    reads = 0
    while writer.poll() is None:
        st = cd.load()  # raises StateError on a torn read
        assert st is not None and st.name == "demo"
        reads += 1
    assert writer.returncode == 0
    assert reads > 0
    assert len(cd.load().processes) == 300  # type: ignore[union-attr]


def test_lock_contention_between_two_processes(tmp_path: Path) -> None:
    cd = ClusterDir("demo", tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from epdctl.state.store import ClusterDir
        with ClusterDir("demo", Path({str(tmp_path)!r})).lock("up"):
            print("locked", flush=True)
            sys.stdin.readline()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(StateError, match=rf"busy.*epdctl up, pid {holder.pid}"):
            with cd.lock("down", timeout=0.2):
                pass
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=30)
    with cd.lock("down"):  # free again once the holder exits
        assert "epdctl down" in cd.lock_file.read_text()


def test_lock_is_exclusive_within_one_process_too(tmp_path: Path) -> None:
    cd = ClusterDir("demo", tmp_path)
    with cd.lock("up"):
        with pytest.raises(StateError, match="busy"):
            with ClusterDir("demo", tmp_path).lock("status"):
                pass


@pytest.mark.parametrize("content, why", [
    ("{not json", "Expecting"),
    ("[1, 2]", "not an object"),
    ('{"version": 99}', "unknown state version"),
    ('{"version": 2, "name": "x", "topology": "t", "launcher": "l", "processes": [{"pid": 1}]}',
     "missing"),
    ('{"version": 2, "name": "x", "topology": "t", "launcher": "l", "processes": {}}',
     "processes is not a list"),
    ('{"version": 2, "name": "x", "topology": "t", "launcher": "l", "processes": [7]}',
     "not an object"),
    ('{"version": 2, "name": "x", "topology": "t", "launcher": "l", "processes": [{"name": "a",'
     ' "role": "decode", "node": "n", "handle": {"pid": "123", "pgid": 1}}]}',
     "handle.pid is str"),
    ('{"version": 2, "name": "x", "topology": "t", "launcher": "l", "processes": [{"name": "a",'
     ' "role": "decode", "node": "n", "handle": {"pid": true, "pgid": 1}}]}',
     "handle.pid is bool"),
    ('{"version": 2, "name": "x", "topology": "t", "launcher": "l", "processes": [{"name": "a",'
     ' "role": "decode", "node": "n", "handle": {"pid": 1, "pgid": 1, "create_time": "x"}}]}',
     "handle.create_time is str"),
    ("\x89\xff\xfe\x00garbage", "utf-8"),
])
def test_corrupt_state_gives_a_clear_error(tmp_path: Path, content: str, why: str) -> None:
    cd = ClusterDir("demo", tmp_path)
    cd.root.mkdir(parents=True)
    cd.state_file.write_bytes(content.encode("latin-1"))
    with pytest.raises(StateError) as e:
        cd.load()
    msg = str(e.value)
    assert "damaged" in msg and str(cd.state_file) in msg and "down demo --force" in msg
    assert why in msg


def test_random_bytes_never_escape_as_anything_but_state_error(tmp_path: Path) -> None:
    import random

    rng = random.Random(14)
    cd = ClusterDir("demo", tmp_path)
    cd.root.mkdir(parents=True)
    good = ('{"version": 2, "name": "x", "topology": "t", "launcher": "local", "processes": '
            '[{"name": "a", "role": "decode", "node": "n", "handle": {"pid": 5, "pgid": 5}}]}')
    for i in range(400):
        data = bytearray(good.encode())
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        cd.state_file.write_bytes(bytes(data[: rng.randint(0, len(data))] if i % 3 == 0
                                        else data))
        try:
            cd.load()
        except StateError:
            pass


def test_missing_state_is_none_and_resolve_explains(tmp_path: Path) -> None:
    assert ClusterDir("demo", tmp_path).load() is None
    with pytest.raises(StateError, match="no cluster is recorded"):
        resolve_cluster(None, tmp_path)
    with pytest.raises(StateError, match="no cluster named 'nope'"):
        resolve_cluster("nope", tmp_path)


def test_resolve_picks_the_only_cluster_and_refuses_ambiguity(tmp_path: Path) -> None:
    ClusterDir("a", tmp_path).save(ClusterState(name="a", topology="t", launcher="local"))
    assert resolve_cluster(None, tmp_path).name == "a"
    ClusterDir("b", tmp_path).save(ClusterState(name="b", topology="t", launcher="local"))
    assert list_clusters(tmp_path) == ["a", "b"]
    with pytest.raises(StateError, match="several clusters.*a, b"):
        resolve_cluster(None, tmp_path)
    assert resolve_cluster("b", tmp_path).name == "b"


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "x" * 65])
def test_bad_names_are_rejected(bad: str) -> None:
    with pytest.raises(StateError, match="invalid cluster name"):
        check_name(bad)


def test_state_dir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPDCTL_STATE_DIR", str(tmp_path / "st"))
    cd = ClusterDir("demo")
    assert cd.root == tmp_path / "st" / "clusters" / "demo"
    assert cd.log("encoder-0") == cd.root / "logs" / "encoder-0.log"


def test_a_version_1_state_is_read_with_engine_rank_and_handle(tmp_path: Path) -> None:
    """State written before the one-record state: flat pid/pgid/create_time, no engine or rank;
    `status` and `down` must still work on a cluster started by that version."""
    topo = tmp_path / "t.yaml"
    topo.write_text("name: x\nengine: sglang\n")
    old = {"version": 1, "name": "x", "topology": str(topo), "launcher": "local",
           "phase": "running", "created": 1.0, "api_key_env": None, "model": "m",
           "processes": [{"name": n, "role": "prefill", "node": "a", "host": "h", "port": 1,
                          "url": "http://h:1", "pid": 10 + i, "pgid": 10 + i,
                          "create_time": 3.5, "log": "l", "since": 4.0, "argv": ["x"],
                          "health_path": "/health", "bootstrap_port": None,
                          "is_leader": i == 0, "router_id": None}
                         for i, n in enumerate(["prefill-0", "prefill-0.r1"])]}
    cd = ClusterDir("x", tmp_path)
    cd.root.mkdir(parents=True)
    cd.state_file.write_text(json.dumps(old))
    st = cd.load()
    assert st is not None and st.version == 2 and st.engine == "sglang"
    r0, r1 = st.processes
    assert r1.handle == Handle(pid=11, pgid=11, create_time=3.5)
    assert (r1.worker, r1.node_rank, r1.engine) == ("prefill-0", 1, "sglang")
    assert [r.name for r in st.ranks("prefill-0")] == ["prefill-0", "prefill-0.r1"]


def test_a_record_is_built_from_the_plan_without_parsing_names() -> None:
    from epdctl.render import build_plan
    from epdctl.topology import load_topology

    root = Path(__file__).resolve().parents[1]
    plan = build_plan(load_topology(root / "topologies" / "local.yaml"))
    recs = [ProcessRecord.of(w, plan.engine) for w in plan.workers]
    assert {(r.name, r.worker, r.node_rank, r.engine) for r in recs} >= {
        ("prefill-0", "prefill-0", 0, "embedded")}
    assert plan.router is not None
    router = ProcessRecord.of(plan.router, plan.engine)
    assert router.name == "router" and router.prometheus_port == plan.router.prometheus_port


def test_a_record_carries_its_spec_and_survives_a_save(tmp_path: Path) -> None:
    """Every field of the plan's spec is on the record (ports by name, capabilities, setup),
    and a saved state reads back the same."""
    from epdctl.render import build_plan
    from epdctl.topology import load_topology

    root = Path(__file__).resolve().parents[1]
    plan = build_plan(load_topology(root / "topologies" / "local.yaml"))
    assert plan.router is not None
    specs = [*plan.workers, plan.router]
    recs = [ProcessRecord.of(s, plan.engine) for s in specs]
    for s, r in zip(specs, recs):
        assert (r.role, r.ports, r.key_vars, r.switchable, r.router_type, r.registers_workers) == (
            s.role, s.ports, list(s.key_vars), s.switchable, s.router_type, s.registers_workers)
        assert r.port == s.port and r.bootstrap_port == s.bootstrap_port
    assert recs[-1].prometheus_host == plan.router.prometheus_host == "127.0.0.1"
    assert [r.router_type for r in recs[:-1] if r.is_leader and r.role != "encoder"] == ["prefill", "decode"]
    cd = ClusterDir("spec", tmp_path)
    cd.save(ClusterState(name="spec", topology="t", launcher="local", processes=recs))
    st = cd.load()
    assert st is not None and st.processes == recs


def test_an_earlier_version_2_state_gets_its_capabilities_from_the_recorded_commands(tmp_path: Path) -> None:
    """A state.json written before records carried the plan's capabilities still loads, and
    what `up`, `rebalance` and the Prometheus targets need is filled in once."""
    old = {"version": 2, "name": "x", "topology": "t.yaml", "launcher": "local", "engine": "embedded",
           "phase": "running", "processes": [
               {"name": "decode-0", "role": "decode", "node": "a", "engine": "embedded", "host": "h", "port": 5,
                "url": "http://h:5", "log": "l", "argv": ["python", "-m", "epdctl.runtime", "decode", "--api-key-env",
                                                          "K", "--switchable"]},
               {"name": "router", "role": "router", "node": "a", "engine": "embedded", "host": "h", "port": 6,
                "url": "http://h:6", "log": "l", "argv": ["python", "-m", "epdctl.router_exec", "K",
                                                          "smg.launch_router", "--prometheus-host", "0.0.0.0",
                                                          "--prometheus-port", "7"]}]}
    cd = ClusterDir("x", tmp_path)
    cd.root.mkdir(parents=True)
    cd.state_file.write_text(json.dumps(old))
    st = cd.load()
    assert st is not None
    dec, router = st.processes
    assert (dec.switchable, dec.key_vars, dec.router_type, dec.ports) == (True, ["K"], "decode", {"http": 5})
    assert (router.key_vars, router.registers_workers, router.prometheus_host, router.prometheus_port) == (
        ["K"], True, "0.0.0.0", 7)
    assert router.ports == {"http": 6, "prometheus": 7}
