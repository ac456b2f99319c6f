"""The router command: smg (default) or sglang-router, in PD mode or plain (colocated) mode.

Only rank-0 (leader) workers are registered; encoders never are (the prefill calls them).
This is exactly what runs (`epdctl render` shows it): fast health checks (a dead worker out of
rotation in seconds, a late one registered within a second of being healthy, since `up` starts
the router together with its workers) unless ``router.args`` chose other values, and with an
API key the command starts the router through ``python -m epdctl.node.router_exec VAR MODULE ...``,
which reads the key from the environment variable VAR so it never appears on a command line.
smg runs with ``--enable-igw`` (its model-aware routing): a request for a model no worker serves
is answered ``404 model_not_found`` in OpenAI's error shape instead of ``503
no_available_workers``, which clients retry and which reads as an outage.
"""

from __future__ import annotations

from typing import Sequence

from epdctl.topology.model import Topology

MODULES = {"smg": "smg.launch_router", "sglang-router": "sglang_router.launch_router",
           "mini_lb": "sglang_router.launch_router",  # SGLang's mini_lb moved into sglang-router (--mini-lb)
           "epdctl-epd": "epdctl.node.epd_router"}  # vLLM's E->P->D sequence over HTTP (smg's EPD is gRPC only)
HEALTH_FLAGS: dict[str, str] = {
    "--health-check-interval-secs": "1",
    "--health-failure-threshold": "2",
    "--health-success-threshold": "1",
    # a busy worker is not a dead one: a dead worker refuses the probe's connection at once (out
    # of rotation after two probes, ~2 s), while a live one on starved cores may answer a probe
    # late; ejecting the only decode for that turns a slow second into 503s for every request
    # (smg's own default is 5 s)
    "--health-check-timeout-secs": "5",
    "--worker-startup-check-interval": "1",
    # a worker that died and was restarted by its supervisor serves again within seconds:
    # the circuit opened by its death half-opens after 2 s instead of smg's 60 (reliability.md)
    "--cb-timeout-duration-secs": "2",
}
KEY_WRAPPER = "epdctl.node.router_exec"


def router_argv(topo: Topology, specs: Sequence[object], host: str, port: int, prom_host: str,
                prom_port: int) -> tuple[str, ...]:
    r = topo.router
    assert r is not None
    module = MODULES[r.implementation]
    argv = [topo.python, "-m", module]
    if r.api_key_env:
        argv = [topo.python, "-m", KEY_WRAPPER, r.api_key_env, module]
    if r.implementation == "mini_lb":
        argv.append("--mini-lb")
    leaders = [s for s in specs if getattr(s, "is_leader")]
    if r.implementation == "epdctl-epd":
        return tuple(argv + _epd_flags(leaders, host, port, prom_host, prom_port) + list(r.args))
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
        # PD mode routes by model with --enable-igw: a model no worker serves is a 404
        # model_not_found, not a 503 (limits.md). Not in regular mode: smg 1.13 with --enable-igw
        # drops --worker-urls (its log reads "mode: Regular { worker_urls: [] }"), so a router
        # started by hand from this command would have no worker; there the worker answers the
        # unknown model's 404 itself.
        if prefills and "--enable-igw" not in r.args:
            argv.append("--enable-igw")
    argv += list(r.args)
    for flag, value in HEALTH_FLAGS.items():
        if flag not in r.args:
            argv += [flag, value]
    return tuple(argv)


def _epd_flags(leaders: Sequence[object], host: str, port: int, prom_host: str, prom_port: int) -> list[str]:
    """epdctl.node.epd_router's flags: every encoder, prefill and decode (colocated: as decode)."""
    out: list[str] = []
    for role, flag in (("encoder", "--encode"), ("prefill", "--prefill"), ("decode", "--decode"),
                       ("colocated", "--decode")):
        for s in leaders:
            if getattr(s, "role") == role:
                out += [flag, getattr(s, "url")]
    return out + ["--host", host, "--port", str(port), "--prometheus-host", prom_host,
                  "--prometheus-port", str(prom_port)]


def registers_workers(argv: Sequence[str]) -> bool:
    """Whether epdctl must register the workers with the router it renders through the router's
    API: its command names no static workers, or names them only with ``--worker-urls`` beside
    ``--enable-igw`` (smg 1.13 then starts with none: its log reads "mode: Regular { worker_urls:
    [] }"). Decided here, from the command being rendered, and recorded in the plan."""
    if "--enable-igw" in argv and "--worker-urls" in argv:
        return True
    return not any(f in argv for f in ("--prefill", "--decode", "--worker-urls", "--encode"))


def router_flags(argv: Sequence[str]) -> list[str]:
    """The router's own flags (after ``python -m MODULE`` or the key wrapper's ``VAR MODULE``)."""
    if len(argv) > 2 and argv[2] == KEY_WRAPPER:
        return list(argv[5:])
    return list(argv[3:])
