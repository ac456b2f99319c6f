"""The router command: smg (default) or sglang-router, in PD mode or plain (colocated) mode.

Only rank-0 (leader) workers are registered; encoders never are (the prefill calls them).
"""

from __future__ import annotations

from typing import Sequence

from epdctl.topology.model import Topology

MODULES = {"smg": "smg.launch_router", "sglang-router": "sglang_router.launch_router"}


def router_argv(topo: Topology, specs: Sequence[object], host: str, port: int, prom_host: str,
                prom_port: int) -> tuple[str, ...]:
    r = topo.router
    assert r is not None
    argv = [topo.python, "-m", MODULES[r.implementation]]
    leaders = [s for s in specs if getattr(s, "is_leader")]
    prefills = [s for s in leaders if getattr(s, "role") == "prefill"]
    decodes = [s for s in leaders if getattr(s, "role") == "decode"]
    if prefills:
        argv.append("--pd-disaggregation")
        for p in prefills:
            boot = getattr(p, "bootstrap_port")
            argv += ["--prefill", getattr(p, "url")] + ([str(boot)] if boot is not None else [])
        for d in decodes:
            argv += ["--decode", getattr(d, "url")]
    else:
        urls = [getattr(s, "url") for s in leaders if getattr(s, "role") == "colocated"]
        argv += ["--worker-urls", *urls]
    argv += ["--host", host, "--port", str(port), "--prometheus-host", prom_host, "--prometheus-port", str(prom_port)]
    if r.policy:
        argv += ["--policy", r.policy]
    if r.implementation == "smg":  # the router refuses bigger bodies (413) before any worker sees them
        argv += ["--max-payload-size", str(topo.limits.max_body_bytes)]
    if r.api_key_env:
        argv += ["--api-key", "${" + r.api_key_env + "}"]
    argv += list(r.args)
    return tuple(argv)
