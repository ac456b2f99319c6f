"""`epdctl import` of sets whose launches run apart: Kubernetes pods (LeaderWorkerSet, Deployment),
one `docker run` per node, `# node N` blocks. Each place is a machine of its own, so servers that
bind the same port in different pods do not collide. The sets are published ones
(tests/fixtures/launch_sets/, sources in their headers); test_import.py round-trips them too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from epdctl.cli import main
from epdctl.errors import EpdctlError
from epdctl.importer import import_scripts, read_sources
from epdctl.importer.containers import docker_run
from epdctl.importer.kube import parse_manifests
from epdctl.importer.roundtrip import compare, load, summary

SETS = Path(__file__).parent / "fixtures" / "launch_sets"
LWS = sorted(str(p) for p in (SETS / "sglang-lws-pd-deepseek").glob("*.yaml"))


def _node_hosts(data: dict) -> dict[str, str]:
    return {n["name"]: n["host"] for n in data["nodes"]}


def test_lws_pods_are_nodes_and_roles_do_not_collide() -> None:
    draft, text, skipped = import_scripts(LWS)
    topo, problems = load(text)
    assert problems == [] and skipped == []
    data = draft.data
    hosts = _node_hosts(data)
    pre, dec = data["roles"]["prefill"]["workers"][0], data["roles"]["decode"]["workers"][0]
    assert pre["port"] == dec["port"] == 30000  # both leaders bind 30000 in the manifests
    assert len(set(pre["nodes"]) | set(dec["nodes"])) == 4  # ... on four different pods
    # the leader's address is what LWS_LEADER_ADDRESS names: the same placeholder in the dist-init address
    assert hosts[pre["nodes"][0]] == "${DEEPSEEKR10528_PREFILL_MAIN_0_HOST}"
    assert hosts[pre["nodes"][1]] == "${DEEPSEEKR10528_PREFILL_MAIN_0_1_HOST}"
    assert hosts[dec["nodes"][0]] == "${DEEPSEEKR10528_DECODE_MAIN_0_HOST}"
    assert hosts[data["router"]["node"]] == "${DEEPSEEKR10528_LB_MAIN_0_HOST}"  # the router's own pod
    matched, total, wiring = summary(compare(draft, text))
    assert wiring and matched == total and total >= 80
    assert len(topo.workers) == 2


def test_lws_expands_ranks_env_and_keeps_the_image() -> None:
    cmds = read_sources([f for f in LWS if f.endswith("p.yaml")])
    assert [c.place for c in cmds] == ["pod deepseekr10528-prefill-main-0", "pod deepseekr10528-prefill-main-0-1"]
    assert all(c.image == "lmsysorg/sglang:latest" for c in cmds)
    lead, worker = cmds
    at = lead.argv.index("--node-rank")
    assert lead.argv[at + 1] == "0" and worker.argv[worker.argv.index("--node-rank") + 1] == "1"
    assert lead.argv[lead.argv.index("--nnodes") + 1] == "2"
    assert worker.argv[worker.argv.index("--dist-init-addr") + 1] == "${DEEPSEEKR10528_PREFILL_MAIN_0_HOST}:20102"
    assert lead.env["MC_TE_METRIC"] == "false" and worker.env["MC_TE_METRIC"] == "true"
    assert "LWS_WORKER_INDEX" not in lead.env  # valueFrom: set by Kubernetes, not a literal


def test_manifest_replicas_shell_commands_and_k8s_refs() -> None:
    text = """apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: dec
spec:
  replicas: 2
  template:
    spec:
      containers:
      - name: s
        image: img:1
        env:
        - name: PORT
          value: "31601"
        command: ["/bin/bash", "-c"]
        args:
        - cd /w && NCCL_DEBUG=INFO python3 -m sglang.launch_server --model-path m --port $(PORT) --host $(POD_IP)
"""
    cmds = parse_manifests(text, "s.yaml")
    assert [c.place for c in cmds] == ["pod dec-0", "pod dec-1"]
    c = cmds[0]
    assert c.argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert c.argv[c.argv.index("--port") + 1] == "31601"
    assert c.argv[c.argv.index("--host") + 1] == "${POD_IP}"  # set by Kubernetes at run time
    assert c.env["NCCL_DEBUG"] == "INFO" and c.image == "img:1" and c.where == "s.yaml:10"


def test_broken_manifest_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: Pod\nspec: [\n")
    with pytest.raises(EpdctlError, match="bad.yaml: not a readable Kubernetes manifest"):
        read_sources([str(bad)])
    with pytest.raises(SystemExit) as info:
        main(["import", str(bad)])
    err = capsys.readouterr().err
    assert info.value.code == 1 and "Traceback" not in err and "bad.yaml" in err


def test_docker_run_per_node_set() -> None:
    path = str(SETS / "sglang-docs-dsv3-docker-two-nodes.sh")
    cmds = read_sources([path])
    servers = [c for c in cmds if "sglang.launch_server" in c.argv]
    assert [c.place for c in servers] == ["container sglang_multinode1", "container sglang_multinode2"]
    assert all(c.image == "lmsysorg/sglang:latest" and c.env == {"HF_TOKEN": "$HF_TOKEN"} for c in servers)
    draft, text, skipped = import_scripts([path])
    assert len(skipped) == 1 and "bench_serving" in skipped[0]  # the client container is not a server
    hosts = _node_hosts(draft.data)
    assert list(hosts.values()) == ["192.168.114.10", "${SGLANG_MULTINODE2_HOST}"]
    assert load(text)[1] == []


def test_node_blocks_are_machines() -> None:
    draft, text, _ = import_scripts([str(SETS / "sglang-docs-dsv3-four-node-blocks.sh")])
    assert list(_node_hosts(draft.data).values()) == ["10.0.0.1", "${NODE_2_HOST}", "${NODE_3_HOST}",
                                                        "${NODE_4_HOST}"]
    matched, total, wiring = summary(compare(draft, text))
    assert wiring and matched == total


def test_same_port_in_two_containers_is_two_nodes(tmp_path: Path) -> None:
    """Without the containers the two servers would share one machine and port 30000."""
    script = tmp_path / "pd.sh"
    base = "python3 -m sglang.launch_server --model-path m --host 0.0.0.0 --port 30000"
    script.write_text(f"docker run -d --name p img {base} --disaggregation-mode prefill\n"
                      f"docker run -d --name d img {base} --disaggregation-mode decode\n"
                      "python3 -m sglang_router.launch_router --pd-disaggregation --prefill http://p:30000 "
                      "--decode http://d:30000\n")
    draft, text, _ = import_scripts([str(script)])
    assert load(text)[1] == []
    assert sorted(_node_hosts(draft.data).values()) == ["${D_HOST}", "${P_HOST}"]
    script.write_text(script.read_text().replace("docker run -d --name p img ", "").replace(
        "docker run -d --name d img ", ""))
    draft, text, _ = import_scripts([str(script)])
    assert any("port" in p or "30000" in p for p in load(text)[1])  # one machine: the ports collide


@pytest.mark.parametrize("toks,argv,env,image", [
    (["docker", "run", "-it", "--rm", "-e", "A=1", "--env=B", "img", "python3", "-m", "x"],
     ["python3", "-m", "x"], {"A": "1", "B": "${B}"}, "img"),
    (["podman", "run", "--gpus", "all", "-v", "/a:/b", "img:2", "bash", "-c", "X=2 python3 -m y --p 1 && echo"],
     ["python3", "-m", "y", "--p", "1"], {"X": "2"}, "img:2"),
])
def test_docker_run_reading(toks: list[str], argv: list[str], env: dict[str, str], image: str) -> None:
    run = docker_run(toks, "f:1")
    assert run is not None and (run.argv, run.env, run.image) == (argv, env, image)


def test_docker_run_without_image_names_the_line() -> None:
    with pytest.raises(EpdctlError, match="f:3: docker run without an image"):
        docker_run(["docker", "run", "--rm", "-d"], "f:3")
    assert docker_run(["docker", "ps"], "f:1") is None
