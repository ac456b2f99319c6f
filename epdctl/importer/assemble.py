"""One imported worker at a time: its nodes (addresses, GPUs, NICs) and its keys and args."""

from __future__ import annotations

from typing import Any

from epdctl.importer.build import ANY, EMBEDDINGS, INT_KEYS, LOOPBACK, STR_KEYS, WIRING, Worker, is_ref, split_addr
from epdctl.importer.containers import place_ref
from epdctl.importer.launches import Launch
from epdctl.importer.shell import ScriptError
from epdctl.engines import ENGINE_NAMES, engine_for
from epdctl.topology.schema import DTYPES

RENDERED = {"--enable-metrics"}
  # epdctl renders these itself on non-encoders


class Assembler:
    def __init__(self, launches: list[Launch], name: str):
        self.servers = [x for x in launches if x.kind in ENGINE_NAMES]
        self.routers = [x for x in launches if x.kind == "router"]
        if not self.servers:
            raise ScriptError("no engine server command found (python -m sglang.launch_server, dynamo.sglang, "
                               "vllm serve ...); nothing to import")
        self.engine = self.servers[0].kind
        if any(s.kind != self.engine for s in self.servers):
            raise ScriptError("the commands mix SGLang and vLLM servers; import each engine's set separately")
        self.name = name
        self.c: dict[str, str] = {}
        self.notes: list[str] = []
        self.nodes: dict[str, dict[str, Any]] = {}  # node name -> node mapping
        self.node_of_host: dict[str, str] = {}
        self.node_gpus: dict[str, int] = {}
        self.roles_on: dict[str, set[str]] = {}
        self.origin: dict[str, Launch] = {}

    def note(self, path: str, text: str) -> None:
        self.c[path] = f"{self.c[path]}; {text}" if path in self.c else text

    # -- nodes ------------------------------------------------------------------------------------
    def node_for(self, host: str, suggested: str, comment: str | None) -> str:
        if host in self.node_of_host:
            return self.node_of_host[host]
        name = suggested
        while name in self.nodes:
            name += "x"
        self.nodes[name] = {"name": name, "host": host}
        self.node_of_host[host] = name
        if comment:
            self.c[f"nodes[{len(self.nodes) - 1}].host"] = comment
        return name

    def rank_host(self, w: Worker, rank: int) -> tuple[str, str | None]:
        """The address of the node that runs ``rank`` of ``w``, and a comment when it is a guess."""
        s = w.ranks[rank]
        bind = s.get("--host") or "127.0.0.1"
        dist = s.get("--dist-init-addr")
        if rank == 0 and dist:
            return split_addr(dist)[0], "from --dist-init-addr (rank 0 of a multi-node worker)"
        if rank in w.synthesized:
            ref = "${" + f"{w.key}_node{rank}_host".upper() + "}"
            return ref, f"guess: the input has no node-rank {rank} command; put that node's address here"
        loopback = bind in LOOPBACK or bind.startswith("127.")
        if loopback and s.cmd.place is None:
            return "127.0.0.1", "the command binds loopback: one machine"
        if not loopback and bind not in ANY and not is_ref(bind):
            return bind, "from --host"
        if s.cmd.place is not None:  # its own pod, container or `# node N` block: its own machine
            return place_ref(s.cmd.place), f"guess: the input runs this apart from the others ({s.cmd.place}); set that machine's address"
        if len(w.ranks) > 1:
            ref = "${" + f"{w.key}_node{rank}_host".upper() + "}"
            return ref, f"guess: the node-rank {rank} command does not say its address ({bind}); set it here"
        url_host = self.router_host_for(s)
        if url_host:
            return url_host, "from the router's URL for this server"
        ref = "${" + f"{w.key}_host".upper() + "}"
        return ref, f"guess: the command binds {bind}; set this node's address"

    def router_host_for(self, s: Launch) -> str | None:
        port = s.get("--port")
        for r in self.routers:
            for flag in ("--prefill", "--decode", "--worker-urls"):
                for vals in r.repeats(flag):
                    for v in vals:
                        if v.startswith("http") and port and v.rstrip("/").endswith(f":{port}"):
                            return v.split("://", 1)[1].rsplit(":", 1)[0]
        return None

    # -- workers ----------------------------------------------------------------------------------
    def worker(self, w: Worker, path: str) -> dict[str, Any]:
        s = w.lead
        out: dict[str, Any] = {}
        names = []
        for rank in range(len(w.ranks)):
            host, why = self.rank_host(w, rank)
            suffix = f"n{rank}" if len(w.ranks) > 1 else ""
            node = self.node_for(host, f"{w.role[0]}{w.index}{suffix}", why)
            names.append(node)
            self.roles_on.setdefault(node, set()).add(w.role)
            for line in w.ranks[rank].cmd.setup:
                if line not in self.nodes[node].setdefault("setup", []):
                    self.nodes[node]["setup"].append(line)
            if rank not in w.synthesized:  # only what the input really says is compared in a round trip
                self.origin[f"{w.role}-{w.index}" + (f".r{rank}" if rank else "")] = w.ranks[rank]
        if len(names) > 1:
            out["nodes"] = names
        else:
            out["node"] = names[0]
        if w.synthesized:
            self.c[f"{path}.nodes"] = (f"guess: node ranks {sorted(w.synthesized)} are not in the input; they run "
                                       f"the rank-0 command with their own --node-rank")
        bind = s.get("--host")
        if bind is not None:
            host0 = self.nodes[names[0]]["host"]
            if bind in ANY:
                out["host"] = bind
            elif is_ref(bind) or bind == host0:
                out["host"] = "node"
                if is_ref(bind):
                    self.c[f"{path}.host"] = f"--host {bind} read as each node's own address"
            elif not (bind in LOOPBACK or bind.startswith("127.")):
                out["host"] = bind
        port = s.get("--port")
        if port is not None and port.isdigit():
            out["port"] = int(port)
        elif port is not None:
            self.note(path, f"--port {port} is a placeholder; epdctl picks a port (set port: N to pin it)")
        for flag, key in (("--disaggregation-bootstrap-port", "bootstrap_port"),
                          ("--encoder-bootstrap-port", "encoder_bootstrap_port"), ("--base-gpu-id", "base_gpu_id")):
            v = s.get(flag)
            if v is not None and v.isdigit():
                out[key] = int(v)
        dist = s.get("--dist-init-addr")
        if dist and len(w.ranks) > 1:
            p = split_addr(dist)[1]
            if p and p.isdigit():
                out["dist_init_port"] = int(p)
        args: list[str] = []
        enc_backend = s.get("--encoder-transfer-backend")
        eng = engine_for(self.engine)
        table = eng.flags(None, s.module)
        wrapped: list[str] = []
        for flag, vals in s.flags:
            owner = table.owner(flag)
            if owner is not None:
                wrapped.append(" ".join([flag, *vals]))
            opt = None if eng.imports.common_names else table.resolve(flag)  # renamed flags are not the table's
            bad = [v for v in vals if opt is not None and opt.choices and v not in opt.choices and not is_ref(v)]
            if flag in INT_KEYS and len(vals) == 1 and vals[0].isdigit():
                out[INT_KEYS[flag]] = int(vals[0])
            elif flag in INT_KEYS and INT_KEYS[flag] in ("tp", "pp", "dp", "attention_dp", "ep"):
                self.note(path, f"{flag} {' '.join(vals)} is a placeholder; set {INT_KEYS[flag]} (epdctl assumed 1)")
            elif flag in STR_KEYS and len(vals) == 1 and not is_ref(vals[0]) and not bad:
                out[STR_KEYS[flag]] = vals[0]
            elif flag == "--mem-fraction-static" and len(vals) == 1 and _float(vals[0]) is not None:
                out["mem_fraction_static"] = _float(vals[0])
            elif flag == "--encoder-transfer-backend" and enc_backend in EMBEDDINGS:
                continue  # transfer.embeddings
            elif flag == "--mooncake-ib-device" and vals == [s.get("--disaggregation-ib-device")]:
                continue  # rendered from the NICs
            elif flag in RENDERED and w.role != "encoder" or flag in eng.imports.rendered:
                continue
            elif flag in eng.imports.rendered_encoder and w.role == "encoder":
                continue
            elif flag in ("--dtype",) and vals and vals[0] in DTYPES:
                continue  # model.dtype
            elif bad:
                self.notes.append(f"{s.cmd.where}: dropped {flag} {' '.join(vals)}: SGLang 0.5.23 does not accept "
                                  f"{', '.join(bad)} (choices: {', '.join((opt.choices if opt else None) or ())}); pick one and add it "
                                  f"to {path}.args")
                self.note(path, f"dropped {flag} {' '.join(vals)} (not accepted by SGLang 0.5.23; see the notes above)")
            elif flag not in WIRING_ALL or flag in ("--mem-fraction-static",) + tuple(
                    f for f, k in INT_KEYS.items() if k not in ("tp", "pp", "dp", "attention_dp", "ep")) + tuple(
                    STR_KEYS):
                args += [flag] + vals
        if s.module not in ("sglang.launch_server",) and eng.takes_module:
            out["module"] = s.module
            self.c[f"{path}.module"] = f"the input runs python -m {s.module}"
        ib = s.get("--disaggregation-ib-device")
        if ib and (ib.lstrip().startswith("{") or ib.endswith(".json")):
            self.notes.append(f"{s.cmd.where}: --disaggregation-ib-device {ib} maps devices per GPU; epdctl gives a "
                              f"worker one NIC list: set nics on the worker (or transfer.rdma: auto)")
            self.note(path, "per-GPU --disaggregation-ib-device map not imported (see the notes above)")
        elif ib:
            nics = [n for n in ib.split(",") if n]
            for n in names:
                nd = self.nodes[n]
                have = {x["name"] for x in nd.setdefault("nics", [])}
                nd["nics"] += [{"name": x, "kind": "ib"} for x in nics if x not in have]
        if args:
            out["args"] = args
        if wrapped:
            owner = table.owner(wrapped[0].split(" ")[0])
            self.note(f"{path}.args", f"wrapper flags of {owner}, kept: {', '.join(wrapped)}")
            self.notes.append(f"{s.cmd.where}: kept the wrapper flags of {owner} (not SGLang's): {', '.join(wrapped)}")
        per = _gpus(out)
        for n in names:
            if "base_gpu_id" in out:
                self.node_gpus[n] = max(self.node_gpus.get(n, 0), out["base_gpu_id"] + per)
            else:
                self.node_gpus[n] = self.node_gpus.get(n, 0) + per
        if out.get("dp", 1) > 1 and "attention_dp" not in out and len(w.ranks) == 1:
            self.c[f"{path}.dp"] = (f"--dp-size {out['dp']} without DP attention means {out['dp']} replicas of "
                                    f"tp {out.get('tp', 1)}; if you meant DP attention use attention_dp")
        return out


WIRING_ALL = set(WIRING) | set(INT_KEYS) | set(STR_KEYS) | {"--nnodes", "--node-rank", "--dtype", "--model",
                                                             "--encoder-transfer-backend"}


def _float(v: str) -> float | None:
    try:
        return float(v)
    except ValueError:
        return None


def _gpus(w: dict[str, Any]) -> int:
    dp = 1 if "--enable-dp-attention" in w.get("args", ()) else w.get("dp", 1)  # the old DP-attention idiom
    per = w.get("tp", 1) * w.get("pp", 1) * dp
    return per // max(1, len(w.get("nodes", [1])))
