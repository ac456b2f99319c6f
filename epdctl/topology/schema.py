"""The topology schema: which keys exist where, their types, and layered worker settings.

Layering (lowest first): top-level ``defaults`` < ``roles.<role>`` < the worker's rank-0 node
``defaults`` < the worker's own keys. ``env`` mappings merge key by key, ``args`` concatenate,
everything else is replaced by the higher layer.
"""

from __future__ import annotations

import re
from typing import Any

from epdctl.engines.registry import ENGINE_NAMES
from epdctl.launchers.kinds import LAUNCHER_NAMES
from epdctl.topology import container as container_block
from epdctl.topology.loader import Document, join
from epdctl.topology.model import SSH, Nic, Node, Role, Settings
from epdctl.topology.model_source import DTYPES, MODEL_KEYS, read_model
from epdctl.topology.reader import Reader

ENGINES = ENGINE_NAMES
LAUNCHERS = LAUNCHER_NAMES
TOP_KEYS = ("name", "model", "engine", "launcher", "python", "defaults", "nodes", "node_defaults", "roles",
            "transfer", "router", "slurm", "ports", "rebalance",
            "limits",   # i14: request limits (epdctl/topology/limits.py)
            "restart",  # restart policy (epdctl/topology/restart.py)
            "startup",  # start-up timeout, the lowest layer of the settings' `startup`
            "check",    # the answer check `up` runs before it reports ready (epdctl/topology/answers.py)
            "container")  # the lowest container: layer (epdctl/topology/container.py)
PARALLEL_KEYS = ("tp", "pp", "dp", "ep", "attention_dp")
SETTING_KEYS = PARALLEL_KEYS + ("chunked_prefill_size", "page_size", "kv_cache_dtype", "moe_a2a_backend",
                                "mem_fraction_static", "max_running_requests", "host", "nics", "module", "args",
                                "env", "cpus", "startup", "container")
STARTUP_KEYS = ("timeout",)
MAX_STARTUP_S = 7 * 86400
NODE_SETTING_KEYS = tuple(k for k in SETTING_KEYS if k not in PARALLEL_KEYS)
NODE_KEYS = ("name", "host", "gpus", "ssh", "nics", "env", "setup", "port_base", "shared", "defaults")
SSH_KEYS = ("user", "port", "key", "jump")
NIC_KEYS = ("name", "kind", "ip", "speed_gbps", "port")
NIC_KINDS = ("ib", "roce", "eth")
ROLE_KEYS = ("nodes", "count", "workers") + SETTING_KEYS
WORKER_KEYS = ("node", "nodes", "port", "bootstrap_port", "encoder_bootstrap_port", "dist_init_port", "base_gpu_id",
               "gpu_ids", "transfer_port") + SETTING_KEYS
MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
KV_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1")
MOE_A2A = ("none", "deepep", "mooncake", "nixl", "mori", "ascend_fuseep", "flashinfer", "megamoe", "deepep_v2",
           "pplx", "ascend_tp", "flashinfer_megamoe")
MAX_PARALLEL = 1024  # GPUs in one worker: far above any real deployment, low enough to stay cheap
MAX_GPUS_PER_NODE = 64
MAX_COUNT = 1024
LIMITS = {"chunked_prefill_size": 1 << 24, "page_size": 1 << 16, "max_running_requests": 1 << 20}



def read_settings(r: Reader, m: dict[str, Any], path: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """The settings present in one layer, typed; absent keys are left out."""
    out: dict[str, Any] = {}
    for key in ("tp", "pp", "dp", "attention_dp", "ep", "chunked_prefill_size", "page_size",
                "max_running_requests"):
        if key in keys and m.get(key) is not None:
            v = r.get(m, path, key, "int", minimum=-1 if key == "chunked_prefill_size" else 1,
                      maximum=LIMITS.get(key, MAX_PARALLEL))
            if v is not None:
                out[key] = v
    if "kv_cache_dtype" in keys and m.get("kv_cache_dtype") is not None:
        out["kv_cache_dtype"] = r.get(m, path, "kv_cache_dtype", "str", choices=KV_DTYPES)
    if "moe_a2a_backend" in keys and m.get("moe_a2a_backend") is not None:
        out["moe_a2a_backend"] = r.get(m, path, "moe_a2a_backend", "str", choices=MOE_A2A)
    if "mem_fraction_static" in keys and m.get("mem_fraction_static") is not None:
        v = r.get(m, path, "mem_fraction_static", "float")
        if v is not None and not 0 < v <= 1:
            r.problem(join(path, "mem_fraction_static"), f"mem_fraction_static must be in (0, 1], got {v}")
        elif v is not None:
            out["mem_fraction_static"] = float(v)
    if m.get("host") is not None:
        out["host"] = r.get(m, path, "host", "str")
    if m.get("nics") is not None:
        out["nics"] = r.get(m, path, "nics", "strlist")
    if "module" in keys and m.get("module") is not None:
        mod = r.get(m, path, "module", "str")
        if mod is not None and not MODULE.match(mod):
            r.problem(join(path, "module"), f"module must be a Python module name such as dynamo.sglang (run as "
                                            f"`python -m MODULE`), got {mod!r}")
        elif mod is not None:
            out["module"] = mod
    if "args" in m:
        out["args"] = r.args(m, path)
        out["args_src"] = ((join(path, "args"), out["args"]),) if out["args"] else ()
    if "env" in m:
        out["env"] = r.env(m, path)
    if "cpus" in keys and m.get("cpus") is not None:
        out["cpus"] = read_cpus(r, m["cpus"], join(path, "cpus"))
    if "startup" in keys and m.get("startup") is not None:
        out["startup_timeout"] = read_startup(r, m["startup"], join(path, "startup"))
    if "container" in keys and "container" in m and m["container"] is not None:
        out["container"] = [container_block.read_layer(r, m["container"], join(path, "container"))]
    return {k: v for k, v in out.items() if v is not None}


def read_cpus(r: Reader, value: Any, path: str) -> tuple[int, ...] | None:
    """``cpus:`` (embedded runtime placement): a list of CPU ids or a Linux cpu list like "0-3,6"."""
    items = value if isinstance(value, list) else str(value).split(",") if isinstance(value, (str, int)) else None
    ids: list[int] = []
    for item in items or [None]:
        text = str(item).strip() if item is not None and not isinstance(item, bool) else ""
        lo, _, hi = text.partition("-")
        if not (lo.isdigit() and (hi.isdigit() or not hi)) or (hi and int(hi) < int(lo)):
            r.problem(path, f"cpus: {value!r} is not a CPU list; write e.g. [0, 1] or \"0-3,6\" (CPU ids as "
                            "`nproc`/`lscpu` number them)")
            return None
        ids.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(set(ids)))


def read_startup(r: Reader, value: Any, path: str) -> float | None:
    """``startup: {timeout: S}``: seconds a worker may take to become healthy (weights loaded,
    graphs captured); default: scaled with the weights' size (epdctl/orchestrate/startup.py)."""
    m = r.mapping(value, path, STARTUP_KEYS, "startup (timeout: SECONDS)")
    if m is None:
        return None
    v = r.get(m, path, "timeout", "float", minimum=1, maximum=MAX_STARTUP_S)
    return float(v) if v is not None else None


def merge_settings(*layers: dict[str, Any]) -> Settings:
    """Apply layers lowest first: env merges, args concatenate, the rest is replaced."""
    merged: dict[str, Any] = {}
    env: dict[str, str] = {}
    args: list[str] = []
    src: list[tuple[str, tuple[str, ...]]] = []
    containers: list[dict[str, Any]] = []
    for layer in layers:
        for key, value in layer.items():
            if key == "container":
                containers.extend(value)
            elif key == "env":
                env.update(value)
            elif key == "args":
                args.extend(value)
            elif key == "args_src":
                src.extend(value)
            else:
                merged[key] = value
    if "--enable-dp-attention" in args and merged.get("dp", 1) > 1 and merged.get("attention_dp", 1) == 1:
        # SGLang's deprecated idiom `--dp-size N --enable-dp-attention` is attention_dp N (validate warns)
        merged["attention_dp"], merged["dp"] = merged["dp"], 1
        args = [a for a in args if a != "--enable-dp-attention"]
    return Settings(**merged, env=env, args=tuple(args), args_src=tuple(src),
                    container=container_block.merge(containers))


def read_nodes(r: Reader, top: dict[str, Any], *, required: bool = True
               ) -> tuple[tuple[Node, ...], dict[str, dict[str, Any]]]:
    """Nodes plus each node's settings layer (its ``defaults``); optional when roles give node counts."""
    raw = top.get("nodes")
    if raw is None:
        if required:
            r.problem("", "missing required key 'nodes' (a list of machines with name and host)")
        return (), {}
    if not isinstance(raw, list) or not raw:
        r.problem("nodes", "nodes must be a non-empty list of mappings (- name: ..., host: ...)")
        return (), {}
    nodes: list[Node] = []
    layers: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for i, item in enumerate(raw):
        path = f"nodes[{i}]"
        m = r.mapping(item, path, NODE_KEYS, "a node")
        if m is None:
            continue
        name = r.get(m, path, "name", "str", required=True)
        host = r.get(m, path, "host", "str", required=True)
        if name is None or host is None:
            continue
        if name in seen:
            r.problem(join(path, "name"), f"node name {name!r} is used twice; node names must be unique")
            continue
        seen.add(name)
        ssh = SSH()
        if m.get("ssh") is not None:
            s = r.mapping(m["ssh"], join(path, "ssh"), SSH_KEYS, "ssh settings")
            if s is not None:
                sp = join(path, "ssh")
                ssh = SSH(user=r.get(s, sp, "user", "str"), port=r.get(s, sp, "port", "int", default=22, minimum=1,
                                                                       maximum=65535),
                          key=r.get(s, sp, "key", "str"), jump=r.get(s, sp, "jump", "str"))
        nics = read_nics(r, m, path)
        setup = r.get(m, path, "setup", "strlist", default=())
        layer: dict[str, Any] = {}
        if m.get("defaults") is not None:
            d = r.mapping(m["defaults"], join(path, "defaults"), NODE_SETTING_KEYS, "node defaults")
            if d is not None:
                layer = read_settings(r, d, join(path, "defaults"), NODE_SETTING_KEYS)
        layers[name] = layer
        nodes.append(Node(name=name, host=host, gpus=r.get(m, path, "gpus", "int", default=0, minimum=0,
                                                         maximum=MAX_GPUS_PER_NODE),
                          ssh=ssh, nics=nics, env=r.env(m, path), setup=setup,
                          port_base=r.get(m, path, "port_base", "int", minimum=1, maximum=65535),
                          shared=r.get(m, path, "shared", "bool", default=False)))
    return tuple(nodes), layers


def read_nics(r: Reader, m: dict[str, Any], path: str) -> tuple[Nic, ...]:
    raw = m.get("nics")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        r.problem(join(path, "nics"), "nics must be a list of mappings (- name: mlx5_0, kind: ib)")
        return ()
    out: list[Nic] = []
    for j, item in enumerate(raw):
        npath = join(join(path, "nics"), j)
        n = r.mapping(item, npath, NIC_KEYS, "a NIC")
        if n is None:
            continue
        name = r.get(n, npath, "name", "str", required=True)
        kind = r.get(n, npath, "kind", "str", default="eth", choices=NIC_KINDS)
        if name is not None:
            out.append(Nic(name=name, kind=kind, ip=r.get(n, npath, "ip", "str"),
                           speed_gbps=r.get(n, npath, "speed_gbps", "float", minimum=0),
                           port=r.get(n, npath, "port", "int", minimum=1)))
    return tuple(out)


def top_level(r: Reader, doc: Document) -> dict[str, Any] | None:
    """The root mapping, checked for unknown keys."""
    if not isinstance(doc.data, dict):
        r.problem("", f"the topology must be a YAML mapping (name: ..., model: ..., nodes: ...), got "
                      f"{type(doc.data).__name__}")
        return None
    anchors = tuple(k for k in doc.data if isinstance(k, str) and k.startswith("x-"))  # `x-base: &base` holders
    return r.mapping(doc.data, "", TOP_KEYS + anchors, "the topology")


__all__ = ["ENGINES", "LAUNCHERS", "MODEL_KEYS", "Role", "read_model", "read_settings", "merge_settings"]
