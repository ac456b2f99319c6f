"""A real Prometheus (Debian's `prometheus`) scrapes the session cluster through the file_sd targets
`epdctl status --prometheus-sd` writes, and every query of monitoring/grafana-epdctl.json returns
data from it. Runs only where the prometheus binary is installed (scripts/test.sh installs it)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
Cluster = Any  # tests/e2e/conftest.py's Cluster (not imported: several test folders have a conftest module)

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
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: epdctl\n"
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
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=60).read()
        assert e.value.code >= 400
