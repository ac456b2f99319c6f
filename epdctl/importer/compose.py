"""The whole imported topology: model, workers by role, and the sections that span workers (env
layers, transfer, router)."""

from __future__ import annotations

import re
from typing import Any

from epdctl.engines import ENGINE_NAMES, engine_for
from epdctl.importer.assemble import Assembler
from epdctl.importer.build import EMBEDDINGS, LOOPBACK, Draft, Worker, check_single, group_workers, secret_env
from epdctl.importer.containers import place_ref
from epdctl.importer.launches import Launch
from epdctl.importer.shell import ScriptError
from epdctl.topology.schema import DTYPES


TRANSLATED = {"CUDA_VISIBLE_DEVICES", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", "UCX_NET_DEVICES"}


def _env(s: Launch) -> dict[str, str]:
    """A command's env without what epdctl renders from keys (GPUs, vLLM's NIXL side channel, UCX NICs)."""
    return {k: v for k, v in {**s.cmd.exported, **s.cmd.env}.items()
            if k not in TRANSLATED or (k == "UCX_NET_DEVICES" and not _ucx_nics(s))}


def _ucx_nics(s: Launch) -> bool:
    return s.kind in ENGINE_NAMES and engine_for(s.kind).imports.ucx_nics


def rendered_env(a: Assembler, w: Worker, item: dict[str, Any], path: str) -> None:
    """CUDA_VISIBLE_DEVICES -> gpu_ids; vLLM's UCX_NET_DEVICES -> the nodes' NICs."""
    env = [{**s.cmd.exported, **s.cmd.env} for s in w.ranks]
    cvd = {e.get("CUDA_VISIBLE_DEVICES") for e in env}
    per = item.get("tp", 1) * item.get("pp", 1) * item.get("dp", 1) // len(w.ranks)
    if len(cvd) == 1 and (v := cvd.pop()) and re.fullmatch(r"\d+(,\d+)*", v) and len(v.split(",")) == per:
        item["gpu_ids"] = [int(x) for x in v.split(",")]
        item.pop("base_gpu_id", None)
        a.c[f"{path}.gpu_ids"] = "from CUDA_VISIBLE_DEVICES"
    elif len(cvd) == 1 and None not in cvd:
        a.notes.append(f"{path}: CUDA_VISIBLE_DEVICES={next(iter(cvd)) if cvd else ''} does not list the worker's "
                       f"{per} GPU(s); set gpu_ids")
    for rank, e in enumerate(env):
        ucx = e.get("UCX_NET_DEVICES") if _ucx_nics(w.lead) else None
        if ucx:
            node = a.nodes[(item.get("nodes") or [item["node"]])[rank]]
            have = {x["name"] for x in node.setdefault("nics", [])}
            node["nics"] += [{"name": n.split(":")[0], "kind": "ib"} for n in ucx.split(",")
                             if n.split(":")[0] not in have]


def env_layers(a: Assembler, workers: list[Worker], roles: dict[str, Any], data: dict[str, Any]) -> None:
    """Env common to every server -> defaults.env; to one worker's ranks -> the worker; else per node."""
    envs = [_env(s) for s in a.servers]
    common = {k: v for k, v in envs[0].items() if all(e.get(k) == v for e in envs)}
    if common:
        data["defaults"] = {"env": secret_env(common, "defaults.env", a.c)}
    seen: dict[str, int] = {}
    for w in workers:
        i = seen.get(w.role, 0)
        seen[w.role] = i + 1
        item = roles[w.role]["workers"][i]
        path = f"roles.{w.role}.workers[{i}]"
        rendered_env(a, w, item, path)
        rank_envs = [{k: v for k, v in _env(s).items() if common.get(k) != v} for s in w.ranks]
        shared = {k: v for k, v in rank_envs[0].items() if all(e.get(k) == v for e in rank_envs)}
        if shared:
            item["env"] = secret_env(shared, f"{path}.env", a.c)
        nodes = item.get("nodes") or [item["node"]]
        for rank, e in enumerate(rank_envs):
            rest = {k: v for k, v in e.items() if k not in shared}
            if rest:
                node = a.nodes[nodes[rank]]
                node.setdefault("env", {}).update(secret_env(rest, f"nodes.{nodes[rank]}.env", a.c))


def transfer(a: Assembler, workers: list[Worker]) -> dict[str, Any]:
    pd = [w.lead for w in workers if w.role in ("prefill", "decode")]
    out: dict[str, Any] = {}
    if not engine_for(a.engine).imports.kv_connector:
        backends = {s.get("--disaggregation-transfer-backend") or "mooncake" for s in pd}
        backend = sorted(backends)[0] if backends else "zmq"
        if len(backends) > 1:
            a.notes.append(f"prefill and decode use different KV transfer backends ({', '.join(sorted(backends))}); "
                           f"kept {backend}")
        if backend == "mooncake_tcp":
            out = {"backend": "mooncake", "rdma": "off"}
        else:
            out = {"backend": backend if backend in ("mooncake", "nixl") else "mooncake"}
        listed = [s.get("--disaggregation-ib-device") or "" for s in pd]
        if backend == "mooncake" and pd and not any(x and not x.lstrip().startswith("{") and not x.endswith(".json")
                                                    for x in listed):
            out["rdma"] = "auto"
            a.c["transfer.rdma"] = "no NIC list in --disaggregation-ib-device: RDMA, SGLang finds the devices"
        enc = {e for w in workers if w.role in ("encoder", "prefill")
               for e in [w.lead.get("--encoder-transfer-backend")] if e is not None and e in EMBEDDINGS}
        if enc:
            out["embeddings"] = EMBEDDINGS[sorted(enc)[0]]
    else:
        kv = " ".join(s.get("--kv-transfer-config") or "" for s in pd)
        out = {"backend": "mooncake" if "Mooncake" in kv else "nixl"} if pd else {}
        for w in workers:
            m = re.search(r'"shared_storage_path"\s*:\s*"([^"]+)"', w.lead.get("--ec-transfer-config") or "")
            if m:
                out["ec_storage_path"] = m.group(1)
                break
    return out


def router_section(a: Assembler, workers: list[Worker], roles: dict[str, Any]) -> dict[str, Any] | None:
    if not a.routers:
        if any(w.role == "prefill" for w in workers):
            a.notes.append("no router command in the input: add a router: section to front prefill and decode")
        return None
    r = a.routers[0]
    first = roles.get("prefill", roles.get("colocated", {"workers": [{}]}))["workers"][0]
    node = (first.get("nodes") or [first.get("node")])[0] or next(iter(a.nodes))
    out: dict[str, Any] = {"node": node, "implementation": r.router_impl}
    a.c["router.node"] = "guess: the input does not say where the router runs"
    if r.cmd.place is not None and r.cmd.place not in {s.cmd.place for s in a.servers}:
        out["node"] = a.node_for(place_ref(r.cmd.place), "router", f"guess: the input runs the router in "
                                 f"{r.cmd.place}; set that machine's address")
        a.c["router.node"] = f"the input runs the router in its own {r.cmd.place.split(' ')[0]}"
    if r.router_impl == "mini_lb" and r.module == "sglang.srt.disaggregation.mini_lb":
        a.c["router.implementation"] = ("SGLang's sglang.srt.disaggregation.mini_lb moved into sglang-router: "
                                        "rendered as python -m sglang_router.launch_router --mini-lb")
    host, port, policy = r.get("--host"), r.get("--port"), r.get("--policy")
    if host:
        out["host"] = host
    if port and port.isdigit():
        out["port"] = int(port)
    if policy in ("random", "round_robin", "cache_aware", "power_of_two"):
        out["policy"] = policy
    for vals in r.repeats("--prefill"):  # URL [BOOTSTRAP_PORT]: the prefill's bootstrap port
        if len(vals) >= 2 and vals[1].isdigit():
            for item in roles.get("prefill", {"workers": []})["workers"]:
                if item.get("port") and vals[0].rstrip("/").endswith(f":{item['port']}"):
                    item.setdefault("bootstrap_port", int(vals[1]))
    prom_host, prom_port = r.get("--prometheus-host"), r.get("--prometheus-port")
    if prom_host:
        out["prometheus_host"] = prom_host
    if prom_port and prom_port.isdigit():
        out["prometheus_port"] = int(prom_port)
    key = r.get("--api-key")
    if key is not None:
        ref = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", key)
        out["api_key_env"] = ref.group(1) if ref else "EPD_ROUTER_API_KEY"
        if not ref:
            a.c["router.api_key_env"] = "the script had the router key inline: export EPD_ROUTER_API_KEY instead"
    managed = {"--host", "--port", "--policy", "--prefill", "--decode", "--pd-disaggregation", "--worker-urls",
               "--prometheus-host", "--prometheus-port", "--mini-lb", "--api-key"}
    extra = [t for f, vals in r.flags if f not in managed for t in [f] + vals]
    if extra:
        out["args"] = extra
    if len(a.routers) > 1:
        a.notes.append(f"{len(a.routers)} router commands; imported the first ({r.cmd.where})")
    return out


def draft(launches: list[Launch], name: str) -> Draft:
    a = Assembler(launches, name)
    workers = group_workers(a.servers, a.notes)
    model_path = check_single(a.servers, "--model-path", "model paths")
    if model_path is None:
        raise ScriptError("the server commands give no --model-path")
    served = check_single(a.servers, "--served-model-name", "served model names")
    model: dict[str, Any] = {"path": model_path}
    if served:
        model["served_name"] = served
    if any(s.has("--trust-remote-code") for s in a.servers):
        model["trust_remote_code"] = True
    dtype = check_single(a.servers, "--dtype", "dtypes")
    if dtype in DTYPES:
        model["dtype"] = dtype
    if any(w.role == "colocated" and w.lead.has("--language-only") for w in workers):
        a.notes.append("a --language-only server without --disaggregation-mode (encoders + one language server) is "
                       "imported as colocated; epdctl runs EPD as encoder + prefill + decode: split it into "
                       "roles.prefill and roles.decode")
    roles: dict[str, Any] = {}
    for w in workers:
        items = roles.setdefault(w.role, {"workers": []})["workers"]
        items.append(a.worker(w, f"roles.{w.role}.workers[{len(items)}]"))
    data: dict[str, Any] = {"name": name, "engine": a.engine}
    hosts = [n["host"] for n in a.nodes.values()]
    local = all(h in LOOPBACK for h in hosts)
    data["launcher"] = "local" if local else "ssh"
    if not local:
        a.c["launcher"] = "guess: the commands run on several machines; or slurm (add a slurm: section)"
    data["model"] = model
    env_layers(a, workers, roles, data)
    data["transfer"] = transfer(a, workers)
    router = router_section(a, workers, roles)
    for i, (n, node) in enumerate(a.nodes.items()):
        node["gpus"] = a.node_gpus.get(n, 0)
        a.c.setdefault(f"nodes[{i}].gpus", "guess: the GPUs the imported commands use on this node")
        if len(a.roles_on.get(n, ())) > 1:
            node["shared"] = True
        if node.get("nics"):
            a.c[f"nodes[{i}].nics"] = "from --disaggregation-ib-device; guess: kind ib (say roce for RoCE)"
    data["nodes"] = list(a.nodes.values())
    data["roles"] = roles
    boxes = [s.container for s in a.servers]
    if boxes and boxes[0] is not None and all(b == boxes[0] for b in boxes):  # one container for all
        data["container"] = boxes[0]
        a.c["container"] = "from the docker/podman run or srun --container-* options around the servers"
    elif any(boxes):
        a.notes.append("the servers run in different containers (or some bare): container: blocks per role or "
                       "worker are not imported; add them by hand")
    if router:
        data["router"] = router
    lines: dict[str, list[str]] = {}
    for s in a.servers:
        for x in s.applied:
            lines.setdefault(x.describe(), []).append(s.cmd.where)
    migrations = [f"{', '.join(where)}: {what}" for what, where in lines.items()]
    return Draft(data, a.c, a.notes, migrations, a.origin)
