"""Decode isolation under image bursts: EPD with pinned pools vs colocated on the same cores.

What the published EPD results claim (decode latency stays flat while image-heavy requests
arrive, because the encoders run elsewhere), in miniature on one CPU host. One run starts each
topology with `epdctl up`, then for ``--seconds``: ``--streams`` long answers (1 image,
``--stream-tokens`` tokens, ignore_eos) run back to back, while every ``--burst-every`` seconds a
burst of ``--burst-size`` requests with 8 images each arrives at once. Reported per mode: the
streams' inter-token gaps (TPOT: between chunks with text) p50/p99/max, the same over the gaps
before chunks that carry one token (``tpot_1tok``; a chunk after tokens that added no text, such
as a multi-token character, spans several decode steps in both modes alike; the streams ask for
``return_token_ids`` to tell them apart), the share of gaps spanning 1, 2, 3, 4+ steps (the top
1 % of gaps are the 3-4-step ones in both modes), p99.9 and the gaps of 20 ms or more (a burst's
stalls: a few per burst, well under 1 % of the gaps), and the bursts' TTFT p50/p99. Modes:
  EPD pinned: topologies/local.yaml with `cpus:` encoders and prefill on CPU 0, decode on CPU 1;
  colocated: topologies/local-colocated.yaml with `cpus: "0-1"` (the same two cores, shared).
The router (smg) and this client are left unpinned by default (``--side-cpus none``; the bench
says so): pinned to CPU 0 beside the encoders and prefill, off the decode's core, they relayed
tokens late (decode write to client p50 0.88 ms vs 0.29 unpinned; a tenth of the tokens arrived
in pairs vs 4-7 %); unpinned, 99 % of the decode's core was the decode's own (perf, session 7).

Measured, not asserted. Usage:
    .venv/bin/python benchmarks/bench_burst_isolation.py [--seconds 20]
Writes benchmarks/results/burst_isolation.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import Harness  # noqa: E402

from epdctl.bench.client import body_for  # noqa: E402
from epdctl.bench.workload import RequestSource, Workload  # noqa: E402

EPD_CPUS = {"encoder": "0", "prefill": "0", "decode": "1"}
# where the router (smg) and this bench client run with --side-cpus auto: off the decode's core in
# EPD (the decode pool is the decode's alone), on the shared cores when colocated
SIDE_CPUS = {"epd": "0", "colocated": "0-1"}


def _cpu_set(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def pin_router(state_dir: Path, cpus: set[int]) -> int:
    """Pin every thread of the router's process group (from the cluster's state.json) to ``cpus``;
    the threads pinned."""
    pgids = set()
    for f in state_dir.rglob("state.json"):
        stack = [json.loads(f.read_text())]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                if node.get("role") == "router" and isinstance(node.get("handle"), dict):
                    pgids.add(node["handle"].get("pgid") or node["handle"].get("pid"))
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
    pinned = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) not in pgids:
                continue
            for task in (proc / "task").iterdir():
                os.sched_setaffinity(int(task.name), cpus)
                pinned += 1
        except (OSError, ProcessLookupError):
            continue
    return pinned


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))] * 1000, 2)


async def stream(session, url: str, body: dict, stamps_out: list[list[float]] | None = None,
                 one_token: list[float] | None = None,
                 spans: list[int] | None = None) -> tuple[float | None, list[float]]:
    """(TTFT, inter-token gaps) of one streamed answer, seconds; the token stamps appended to
    ``stamps_out`` when given, and to ``one_token`` the gaps before chunks that carry exactly one
    token (``return_token_ids``: a gap before a chunk of k tokens spans k decode steps, because
    the k-1 before it added no text); to ``spans`` each gap's k."""
    t0 = time.perf_counter()
    stamps: list[float] = []
    ids: list[int] = []
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        async for raw in resp.content:
            line = raw.strip()
            if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
                chunk = json.loads(line[5:])
                choices = chunk.get("choices") or []
                if any((c.get("delta") or {}).get("content") for c in choices):
                    stamps.append(time.perf_counter())
                    ids.append(sum(len(c.get("token_ids") or []) for c in choices))
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    if stamps_out is not None:
        stamps_out.append(stamps)
    if one_token is not None:
        one_token.extend(g for g, n in zip(gaps, ids[1:]) if n == 1)
    if spans is not None:
        spans.extend(ids[1:])
    return (stamps[0] - t0 if stamps else None), gaps


async def load(base: str, model: str, args: argparse.Namespace) -> dict:
    import aiohttp

    url = base + "/v1/chat/completions"
    streams_src = RequestSource(Workload(images={1: 1.0}, plain=True, seed=1, concurrency=1))
    burst_src = RequestSource(Workload(images={8: 1.0}, repeat=0.0, seed=2, concurrency=1))
    gaps: list[float] = []
    one_token: list[float] = []
    spans: list[int] = []
    burst_ttft: list[float] = []
    stamps: list[list[float]] = []
    bursts_at: list[float] = []
    errors: list[str] = []
    end = time.perf_counter() + args.seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=300)) as session:
        await stream(session, url, body_for(streams_src.next(), model, 4))  # warm-up

        async def streamer() -> None:
            while time.perf_counter() < end:
                try:
                    body = {**body_for(streams_src.next(), model, args.stream_tokens, True), "return_token_ids": True}
                    gaps.extend((await stream(session, url, body, stamps, one_token, spans))[1])
                except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                    errors.append(str(exc)[:200])

        async def one_burst_request() -> None:
            try:
                ttft, _ = await stream(session, url, body_for(burst_src.next(), model, 4))
                if ttft is not None:
                    burst_ttft.append(ttft)
            except Exception as exc:  # noqa: BLE001
                errors.append(str(exc)[:200])

        async def bursts() -> None:
            await asyncio.sleep(args.burst_every / 2)
            while time.perf_counter() < end:
                bursts_at.append(time.perf_counter())
                await asyncio.gather(*(one_burst_request() for _ in range(args.burst_size)))
                await asyncio.sleep(args.burst_every)

        await asyncio.gather(bursts(), *(streamer() for _ in range(args.streams)))
    return {"tpot_gaps": len(gaps), "tpot_p50_ms": pct(gaps, 50), "tpot_p99_ms": pct(gaps, 99),
            "tpot_max_ms": pct(gaps, 100), "tpot_p999_ms": pct(gaps, 99.9),
            "tpot_over_20ms": sum(g >= 0.02 for g in gaps), "steps_per_gap_share": step_shares(spans),
            "tpot_1tok_gaps": len(one_token), "tpot_1tok_p50_ms": pct(one_token, 50),
            "tpot_1tok_p99_ms": pct(one_token, 99), "tpot_1tok_max_ms": pct(one_token, 100), "burst_requests": len(burst_ttft),
            "burst_ttft_p50_ms": pct(burst_ttft, 50), "burst_ttft_p99_ms": pct(burst_ttft, 99),
            "errors": errors[:5], "error_count": len(errors), "_stamps": stamps, "_bursts_at": bursts_at}


def step_shares(spans: list[int]) -> dict[str, float]:
    """The share of gaps spanning 1, 2, 3 and 4+ decode steps: where the p99 falls (the streams'
    answers have runs of tokens that add no text; the top 1 % of gaps are their 3-4-step ones)."""
    keys = ("1", "2", "3", "4+")
    counts = {k: sum(1 for n in spans if (str(n) if n < 4 else "4+") == k) for k in keys}
    return {k: round(c / max(1, len(spans)), 4) for k, c in counts.items()}


def topology(h: Harness, mode: str, port_base: int, trace: Path | None = None) -> tuple[Path, str, str]:
    """The mode's topology with its pinning, on ports port_base..+99; (file, cluster name, model)."""
    src = ROOT / "topologies" / ("local.yaml" if mode == "epd" else "local-colocated.yaml")
    doc = yaml.safe_load(src.read_text())
    doc["ports"] = {"base": port_base, "limit": port_base + 99}
    for role, spec in doc["roles"].items():
        spec["cpus"] = EPD_CPUS[role] if mode == "epd" else "0-1"
        if trace is not None:
            spec["env"] = {**(spec.get("env") or {}), "EPDCTL_LOOP_TRACE": str(trace / f"{mode}-{role}.json")}
    name = f"burst-{mode}"
    return h.topology(doc, name), name, doc["model"]["served_name"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--stream-tokens", type=int, default=96)
    ap.add_argument("--burst-size", type=int, default=8)
    ap.add_argument("--burst-every", type=float, default=3.0)
    ap.add_argument("--port-base", type=int, default=31200)
    ap.add_argument("--side-cpus", default="none",
                    help="CPUs for the router and this client: none (unpinned, default), auto (EPD: %s, "
                         "colocated: %s) or a CPU list" % (SIDE_CPUS["epd"], SIDE_CPUS["colocated"]))
    ap.add_argument("--trace", type=Path, default=None,
                    help="folder for timelines: the decode's (EPDCTL_LOOP_TRACE) and the client's token stamps; "
                         "read them with benchmarks/burst_gaps.py")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/burst_isolation.json")
    args = ap.parse_args()
    if args.trace is not None:
        args.trace = args.trace.resolve()
        args.trace.mkdir(parents=True, exist_ok=True)
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("needs at least 2 CPUs (CPU 0 and 1)")
    h = Harness("epdctl-burst-")
    results: dict = {"command": " ".join(["benchmarks/bench_burst_isolation.py", *sys.argv[1:]]),
                     "cpus": {"epd": EPD_CPUS, "colocated": "0-1"}, "load_avg_at_start": os.getloadavg()}
    for mode in ("epd", "colocated"):
        path, name, model = topology(h, mode, args.port_base, args.trace)
        from epdctl.render import build_plan
        from epdctl.topology import load_topology

        plan = build_plan(load_topology(path))
        print(f"$ epdctl up {name}", flush=True)
        h.epdctl("up", str(path), "--no-canary", "--skip-preflight")
        everything = os.sched_getaffinity(0)
        try:
            side = SIDE_CPUS[mode] if args.side_cpus == "auto" else args.side_cpus
            if side != "none":
                threads = pin_router(h.tmp / "state", _cpu_set(side))
                os.sched_setaffinity(0, _cpu_set(side))  # this client (its event loop thread)
                print(f"  router ({threads} threads) and bench client pinned to CPU {side}", flush=True)
            else:
                print("  router and bench client unpinned (--side-cpus)", flush=True)
            results[mode] = asyncio.run(load(plan.router.url, model, args))
            results[mode]["router_and_client_cpus"] = side
        finally:
            os.sched_setaffinity(0, everything)
            h.epdctl("down", name, check=False)
        client = {"stamps": results[mode].pop("_stamps"), "bursts_at": results[mode].pop("_bursts_at")}
        if args.trace is not None:
            (args.trace / f"{mode}-client.json").write_text(json.dumps(client))
    print(f"{'':24} {'EPD pinned':>12} {'colocated':>12}")
    for key in ("tpot_p50_ms", "tpot_p99_ms", "tpot_p999_ms", "tpot_max_ms", "tpot_over_20ms", "tpot_1tok_p50_ms",
                "tpot_1tok_p99_ms", "tpot_1tok_max_ms", "tpot_1tok_gaps", "burst_ttft_p50_ms", "burst_ttft_p99_ms",
                "tpot_gaps", "burst_requests", "error_count"):
        print(f"{key:24} {results['epd'][key]!s:>12} {results['colocated'][key]!s:>12}")
    print(f"{'steps per gap (share)':24} {results['epd']['steps_per_gap_share']} / "
          f"{results['colocated']['steps_per_gap_share']}")
    e, c = results["epd"]["tpot_p99_ms"], results["colocated"]["tpot_p99_ms"]
    if e and c:
        results["tpot_p99_ratio_epd_over_colocated"] = round(e / c, 3)
        print(f"decode TPOT p99, EPD / colocated: {e / c:.2f}")
    e1, c1 = results["epd"]["tpot_1tok_p99_ms"], results["colocated"]["tpot_1tok_p99_ms"]
    if e1 and c1:
        results["tpot_1tok_p99_ratio_epd_over_colocated"] = round(e1 / c1, 3)
        print(f"  over gaps before one-token chunks (one decode step each): {e1 / c1:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
