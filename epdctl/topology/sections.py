"""The cluster-wide blocks of a topology: transfer, router, slurm, ports and rebalance.

Each reader takes the root mapping, records problems on the Reader (YAML path and line) and returns
the block's model object, or its default when the block is absent or unreadable.
"""

from __future__ import annotations

from typing import Any

from epdctl.topology.model import Ports, Router, Slurm, Transfer
from epdctl.topology.reader import ENV_NAME, Reader

TRANSFER_KEYS = ("backend", "embeddings", "nics", "ec_storage_path", "store", "rdma")
TRANSFER_RDMA = ("nics", "auto", "off")
# shared-storage: vLLM's ExampleConnector (KV) and ECExampleConnector (embeddings) through files in
# a store directory epdctl creates and removes (transfer.store); runs without GPUs or RDMA
TRANSFER_BACKENDS = ("zmq", "mooncake", "nixl", "shared-storage")
ENGINE_KEYS = ("name", "version", "venv", "python", "device")
ENGINE_DEVICES = ("cuda", "cpu")  # engine.device values some record answers to (engine_for checks the pair)
ROUTER_KEYS = ("node", "host", "port", "prometheus_host", "prometheus_port", "api_key_env", "implementation",
               "policy", "args")
ROUTER_IMPLS = ("smg", "sglang-router", "mini_lb", "epdctl-epd")
ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two")
SLURM_KEYS = ("partition", "account", "time", "gpus_per_node", "qos", "constraint", "extra")
PORTS_KEYS = ("base", "limit")
REBALANCE_KEYS = ("in_place",)


def read_transfer(r: Reader, top: dict[str, Any]) -> Transfer:
    m = r.section(top, "transfer", TRANSFER_KEYS)
    if m is None:
        return Transfer()
    if m.get("rdma") is False:  # YAML 1.1 reads a bare `off` as false
        m = {**m, "rdma": "off"}
    return Transfer(backend=r.get(m, "transfer", "backend", "str", default="zmq", choices=TRANSFER_BACKENDS),
                    embeddings=r.get(m, "transfer", "embeddings", "str", choices=("zmq", "mooncake")),
                    rdma=r.get(m, "transfer", "rdma", "str", default="nics", choices=TRANSFER_RDMA),
                    nics=r.get(m, "transfer", "nics", "strlist"),
                    ec_storage_path=r.get(m, "transfer", "ec_storage_path", "str"),
                    store=r.get(m, "transfer", "store", "str"))


def read_engine(r: Reader, top: dict[str, Any], names: tuple[str, ...]
                ) -> tuple[str | None, str | None, str | None, str | None, str | None]:
    """``engine: NAME`` or ``engine: {name, version, venv, python, device}``: (name, version, venv,
    python, device)."""
    value = top.get("engine")
    if not isinstance(value, dict):
        return r.get(top, "", "engine", "str", required=True, choices=names), None, None, None, None
    m = r.mapping(value, "engine", ENGINE_KEYS, "engine")
    if m is None:
        return None, None, None, None, None
    name = r.get(m, "engine", "name", "str", required=True, choices=names)
    venv, python = r.get(m, "engine", "venv", "str"), r.get(m, "engine", "python", "str")
    for key, v in (("venv", venv), ("python", python)):
        if v is not None and not v.startswith(("/", "./", "../")):
            r.problem(f"engine.{key}", f"engine.{key} must be an absolute path on the nodes (or ./ ../ from the "
                                       f"topology file), got {v!r}")
    if venv is not None and python is not None:
        r.problem("engine", "engine.venv and engine.python both name the engine's interpreter: keep one")
    return (name, r.get(m, "engine", "version", "str"), venv, python,
            r.get(m, "engine", "device", "str", choices=ENGINE_DEVICES))


def read_router(r: Reader, top: dict[str, Any]) -> Router | None:
    m = r.section(top, "router", ROUTER_KEYS)
    if m is None:
        return None
    node = r.get(m, "router", "node", "str", required=True)
    key_env = r.get(m, "router", "api_key_env", "str")
    if key_env is not None and not ENV_NAME.match(key_env):
        r.problem("router.api_key_env", f"api_key_env must be the NAME of an environment variable (e.g. "
                                        f"EPD_ROUTER_API_KEY), not the key itself; got a value that is not a name")
        key_env = None
    port_args: dict[str, Any] = dict(minimum=1, maximum=65535)
    return Router(node=node or "", host=r.get(m, "router", "host", "str", default="127.0.0.1"),
                  port=r.get(m, "router", "port", "int", **port_args),
                  prometheus_host=r.get(m, "router", "prometheus_host", "str"),
                  prometheus_port=r.get(m, "router", "prometheus_port", "int", **port_args),
                  api_key_env=key_env,
                  implementation=r.get(m, "router", "implementation", "str", default="smg", choices=ROUTER_IMPLS),
                  policy=r.get(m, "router", "policy", "str", choices=ROUTER_POLICIES),
                  args=r.args(m, "router"))


def read_slurm(r: Reader, top: dict[str, Any]) -> Slurm | None:
    m = r.section(top, "slurm", SLURM_KEYS)
    if m is None:
        return None
    extra: dict[str, str] = {}
    if m.get("extra") is not None:
        if isinstance(m["extra"], dict) and all(isinstance(v, (str, int, float)) for v in m["extra"].values()):
            extra = {str(k): str(v) for k, v in m["extra"].items()}
        else:
            r.problem("slurm.extra", "slurm.extra must map sbatch option names to values (e.g. exclusive: '')")
    time = m.get("time")
    if isinstance(time, int) and not isinstance(time, bool):
        # YAML 1.1 reads 04:00:00 as the base-60 integer 14400
        r.problem("slurm.time", f"time was read as the number {time}; quote it, e.g. time: \"04:00:00\"")
        time = None
    else:
        time = r.get(m, "slurm", "time", "str")
    return Slurm(partition=r.get(m, "slurm", "partition", "str"), account=r.get(m, "slurm", "account", "str"),
                 time=time,
                 gpus_per_node=r.get(m, "slurm", "gpus_per_node", "int", minimum=0),
                 qos=r.get(m, "slurm", "qos", "str"), constraint=r.get(m, "slurm", "constraint", "str"), extra=extra)


def read_ports(r: Reader, top: dict[str, Any]) -> Ports:
    m = r.section(top, "ports", PORTS_KEYS)
    if m is None:
        return Ports()
    base = r.get(m, "ports", "base", "int", default=30000, minimum=1, maximum=65535)
    limit = r.get(m, "ports", "limit", "int", minimum=1, maximum=65535)
    if limit is not None and limit < base:
        r.problem("ports.limit", f"ports.limit {limit} is below ports.base {base}")
        limit = None
    return Ports(base=base, limit=limit)


def read_in_place(r: Reader, top: dict[str, Any]) -> bool:
    """``rebalance: {in_place: ...}``: start workers switchable where the engine can (a move
    keeps the model loaded); on by default, ``false`` makes every move a restart."""
    m = r.section(top, "rebalance", REBALANCE_KEYS)
    return bool(r.get(m, "rebalance", "in_place", "bool", default=True)) if m else True
