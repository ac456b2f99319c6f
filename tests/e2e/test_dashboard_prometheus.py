"""A real Prometheus (Debian's `prometheus`) scrapes a cluster that has an API key through the
file_sd targets `epdctl status --prometheus-sd` writes, with the key from an ``authorization:
credentials_file:`` (the workers' /metrics answer only with it; the SD file holds no secret), and
every query of monitoring/grafana-epdctl.json returns data from it. Own keyed cluster (ports
30900-30999, its own EPDCTL_STATE_DIR). Runs only where the prometheus binary is installed
(scripts/test.sh installs it)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from own_cluster import local_copy

ROOT = Path(__file__).resolve().parents[2]
NAME, BASE = "keyed-prom", 30900
KEY_ENV, KEY = "EPD_PROM_TEST_KEY", "k-" + os.urandom(12).hex()

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
DASHBOARD = ROOT / "monitoring" / "grafana-epdctl.json"
PORTS = range(36990, 37000)  # inside the tests' 31000-39999 range, clear of the clusters' ports

pytestmark = pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="prometheus is not installed "
                                                                       "(apt-get install prometheus)")


def _free_port() -> int:
    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise AssertionError(f"no free port in {PORTS}")


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    data = _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert data["status"] == "success", (expr, data)
    return data["data"]["result"]


class Cluster:
    """This module's own cluster: topologies/local.yaml with the router's API key set."""

    def __init__(self, tmp: Path):
        doc = local_copy(NAME, BASE)
        doc["router"]["api_key_env"] = KEY_ENV
        self.name, self.model = NAME, doc["model"]["served_name"]
        self.topology = tmp / f"{NAME}.yaml"
        self.topology.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.env = dict(os.environ, EPDCTL_STATE_DIR=str(tmp / "state"), **{KEY_ENV: KEY})
        self.router_url = ""

    def epdctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "epdctl", *args], env=self.env, cwd=ROOT, text=True,
                              capture_output=True, timeout=600)

    def state(self) -> dict[str, Any]:
        path = Path(self.env["EPDCTL_STATE_DIR"]) / "clusters" / NAME / "state.json"
        return json.loads(path.read_text())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("keyed"))
    up = c.epdctl("up", str(c.topology), "--timeout", "600", "--no-canary")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        c.router_url = next(p["url"] for p in c.state()["processes"] if p["role"] == "router")
        yield c
    finally:
        down = c.epdctl("down", NAME)
        assert down.returncode == 0, down.stdout + down.stderr


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel, rows included."""
    doc = json.loads(DASHBOARD.read_text())

    def panels(p: dict[str, Any]) -> Iterator[dict[str, Any]]:
        for x in p.get("panels", []):
            yield x
            yield from panels(x)

    return [(p.get("title", "?"), t["expr"]) for p in panels(doc) for t in p.get("targets", []) if t.get("expr")]


@pytest.fixture(scope="module")
def prometheus(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("prometheus")
    sd = tmp / "epdctl-targets.json"
    st = cluster.epdctl("status", cluster.name, "--prometheus-sd", str(sd))
    assert "Traceback" not in st.stderr and sd.exists(), st.stdout + st.stderr
    assert KEY not in sd.read_text()  # nothing secret in the SD file
    assert "credentials_file" in st.stdout + st.stderr, st.stdout + st.stderr  # status says how
    key_file = tmp / "epdctl.key"   # the operator's file, readable by Prometheus only
    key_file.write_text(KEY)
    key_file.chmod(0o600)
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: epdctl\n"
        f"    authorization: {{type: Bearer, credentials_file: '{key_file}'}}\n"
        f"    file_sd_configs: [{{files: ['{sd}'], refresh_interval: 1s}}]\n")
    port = _free_port()
    log = open(tmp / "prometheus.log", "w")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if _get(f"{base}/api/v1/status/buildinfo")["status"] == "success":
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "prometheus did not start in 60 s"
            time.sleep(0.5)
        yield base, sd
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _wait(base: str, expr: str, want: int, timeout: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        res = _query(base, expr)
        if len(res) >= want or time.monotonic() > deadline:
            return res
        time.sleep(0.5)


def test_targets_file_names_every_worker_and_the_router(cluster: Cluster,
                                                         prometheus: tuple[str, Path]) -> None:
    _, sd = prometheus
    groups = json.loads(sd.read_text())
    state = cluster.state()
    leaders = [p for p in state["processes"] if p.get("is_leader", True)]
    assert len(groups) == len(leaders)
    by_worker = {g["labels"]["worker"]: g for g in groups}
    for p in leaders:
        g = by_worker[p["name"]]
        assert g["labels"] == {"cluster": cluster.name, "role": p["role"], "worker": p["name"], "node": p["node"]}
        if p["role"] != "router":
            assert p["url"].endswith(g["targets"][0])
    assert {g["labels"]["role"] for g in groups} == {"encoder", "prefill", "decode", "router"}


def test_worker_metrics_need_the_key(cluster: Cluster) -> None:
    for p in cluster.state()["processes"]:
        if p["role"] == "router":
            continue
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(p["url"] + "/metrics", timeout=10).read()
        assert e.value.code == 401, p["name"]
        req = urllib.request.Request(p["url"] + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200 and b"# TYPE" in r.read()


def test_real_prometheus_scrapes_every_target_and_every_dashboard_query_has_data(
        cluster: Cluster, prometheus: tuple[str, Path]) -> None:
    base, sd = prometheus
    n = len(json.loads(sd.read_text()))
    up = _wait(base, f'up{{cluster="{cluster.name}"}} == 1', n)
    assert len(up) == n, (_query(base, "up"), _get(f"{base}/api/v1/targets"))
    labels = {r["metric"]["worker"]: r["metric"] for r in up}
    assert all(m["job"] == "epdctl" and m["cluster"] == cluster.name for m in labels.values())
    # traffic for the histograms and counters, plus one failing request for the error panels
    bench = cluster.epdctl("bench", cluster.name, "--images", "1-2", "--repeat", "0.5", "--concurrency", "2",
                           "--requests", "4", "--max-tokens", "8", "--quiet")
    assert bench.returncode == 0, bench.stdout + bench.stderr
    _bad_request(cluster)
    time.sleep(4)  # a few more scrapes after the traffic
    empty = []
    for title, expr in dashboard_queries():
        q = expr.replace("$__rate_interval", "5m").replace('=~"$job"', '=~".+"')
        if not _query(base, q):
            empty.append(f"{title}: {expr}")
    names = _get(f"{base}/api/v1/label/__name__/values")["data"]
    seen = [r["metric"] for r in _query(base, "epd_decode_requests_total or smg_router_request_errors_total")]
    assert not empty, ("dashboard queries without data:\n" + "\n".join(empty)
                       + f"\nseries names: {names}\ndecode statuses: {seen}")


def _bad_request(cluster: Cluster) -> None:
    """Requests that fail: one through the router (an image the prefill cannot fetch), one straight
    to the decode worker (no bootstrap fields, which only a PD router adds) -> error-status series."""
    body = {"model": cluster.model, "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "file:///nonexistent.png"}}, {"type": "text", "text": "?"}]}]}
    decode = next(p["url"] for p in cluster.state()["processes"] if p["role"] == "decode")
    for url in (cluster.router_url, decode):
        req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=60).read()
        assert e.value.code >= 400
