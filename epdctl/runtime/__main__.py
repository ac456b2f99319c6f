"""``python -m epdctl.runtime {encoder,prefill,decode,colocated} ...``: start one worker.

The command line is the contract with epdctl's control plane (docs/architecture.md). A worker
that cannot start (bad model path, port in use) exits 1 with one line on stderr saying why;
SIGTERM stops it gracefully (encoders unregister from their prefills first).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from pathlib import Path

# Before torch loads libgomp: idle OpenMP threads of a disaggregated worker must sleep, not
# spin. E/P/D workers are several processes per CPU host, and spinning threads of an idle
# decode starve a busy encoder (benchmarks/bench_omp_wait.py: TTFT p50 805 -> 49 ms at 3 req/s
# on 2 cores). A colocated worker is alone on its cores and keeps libgomp's default, which wakes
# faster (TTFT p50 20 vs 52 ms). An OMP_WAIT_POLICY already in the environment wins.
if len(sys.argv) > 1 and sys.argv[1] in ("encoder", "prefill", "decode"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from epdctl.runtime.limits import DEFAULT_MAX_BODY_BYTES, add_limit_flags  # noqa: E402

log = logging.getLogger("epdctl.runtime")


def _common(p: argparse.ArgumentParser, served: bool = True) -> None:
    p.add_argument("--model-path", required=True, help="local Hugging Face Qwen2-VL checkpoint folder")
    if served:
        p.add_argument("--served-model-name", default=None, help="model name clients use (default: folder name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log-level", default=os.environ.get("EPD_LOG_LEVEL", "INFO"))
    p.add_argument("--cpus", default=None, help="pin this worker to these CPU ids (e.g. 0,1 or 0-3); "
                                                "torch then runs one thread per pinned CPU")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: one per --cpus "
                                                            "CPU, else torch's default)")


def _switchable(p: argparse.ArgumentParser) -> None:
    p.add_argument("--switchable", action="store_true",
                   help="load the whole model and accept POST /admin/switch_role (role change in place)")


def _transport(p: argparse.ArgumentParser) -> None:
    p.add_argument("--transport", choices=["zmq", "zmq-ipc", "mooncake"], default="zmq")
    p.add_argument("--ib-device", default=None, help="RDMA device for --transport mooncake")
    p.add_argument("--transfer-port", type=int, default=0,
                   help="port of this worker's transfer endpoint (0: any free port; epdctl renders one from the "
                        "topology's port range)")


def _api_key(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-key-env", default=None, metavar="NAME",
                   help="environment variable holding the cluster's API key; the encoder registry, "
                        "the KV bootstrap, /metrics and POST /admin/switch_role then require it "
                        "(Authorization: Bearer KEY), and encoders and decodes send it to the prefills")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m epdctl.runtime", description=__doc__.splitlines()[0])
    roles = parser.add_subparsers(dest="role", required=True)

    enc = roles.add_parser("encoder", help="vision encoder worker")
    _common(enc, served=False)
    _transport(enc)
    enc.add_argument("--cache-mb", type=float, default=256.0, help="embedding cache size")
    enc.add_argument("--max-batch-size", type=int, default=32, help="images per vision-tower batch")
    enc.add_argument("--batch-wait-ms", type=float, default=0.0,
                     help="how long an idle encoder waits for more requests to batch (requests that queue "
                          "during a pass always share the next one)")
    enc.add_argument("--register-urls", nargs="+", default=[], help="prefill encoder-bootstrap URLs to join")
    add_limit_flags(enc, images=False)
    _api_key(enc)
    _switchable(enc)

    pre = roles.add_parser("prefill", help="prefill worker (calls the encoders, hands KV to the decode)")
    _common(pre)
    _transport(pre)
    add_limit_flags(pre)
    _api_key(pre)
    pre.add_argument("--bootstrap-port", type=int, required=True, help="KV bootstrap port (decodes connect here)")
    pre.add_argument("--encoder-bootstrap-port", type=int, required=True, help="encoder registry port")
    pre.add_argument("--encoder-urls", nargs="*", default=[], help="encoder worker URLs")
    pre.add_argument("--max-running-requests", type=int, default=64)
    pre.add_argument("--kv-timeout", type=float, default=30.0, help="seconds to wait for the decode of a room")
    pre.add_argument("--encoder-timeout", type=float, default=60.0, help="seconds per encoder call")
    pre.add_argument("--encoder-probe-interval", type=float, default=2.0, help="encoder health-probe period (0: off)")
    _switchable(pre)

    dec = roles.add_parser("decode", help="decode worker (continuous batching)")
    _common(dec)
    _transport(dec)
    dec.add_argument("--max-running-requests", type=int, default=64)
    dec.add_argument("--kv-timeout", type=float, default=30.0, help="seconds to wait for a room's KV")
    dec.add_argument("--max-images-per-request", type=int, default=16, help="reported only; the prefill enforces it")
    dec.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="HTTP body size limit")
    _api_key(dec)  # its /metrics, its calls to the prefill's /kv/route, POST /admin/switch_role
    _switchable(dec)

    col = roles.add_parser("colocated", help="encoder+prefill+decode in one process")
    _common(col)
    add_limit_flags(col)
    col.add_argument("--max-running-requests", type=int, default=64)
    col.add_argument("--cache-mb", type=float, default=256.0)
    _api_key(col)
    return parser


def _ports(args: argparse.Namespace) -> list[int]:
    return [p for p in (args.port, getattr(args, "bootstrap_port", None),
                        getattr(args, "encoder_bootstrap_port", None), getattr(args, "transfer_port", None) or None)
            if p is not None]


def preflight(args: argparse.Namespace) -> str | None:
    """Cheap checks before the slow model load, so a wrong command fails in a second."""
    folder = Path(args.model_path).expanduser()
    if not folder.is_dir():
        return f"--model-path {args.model_path}: not a directory (pass a local Qwen2-VL checkpoint folder)"
    if not (folder / "config.json").is_file():
        return f"--model-path {args.model_path}: no config.json (expected a Hugging Face checkpoint folder)"
    ports = _ports(args)
    if len(set(ports)) != len(ports):
        return f"ports {ports}: --port, --bootstrap-port, --encoder-bootstrap-port and --transfer-port must differ"
    for port in ports:
        if not 1 <= port <= 65535:
            return f"port {port}: must be between 1 and 65535"
        with socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((args.host, port))
            except OSError as exc:
                return f"cannot listen on {args.host}:{port}: {exc.strerror or exc} (is another process using it?)"
    return None


async def _run(args: argparse.Namespace) -> None:
    if getattr(args, "switchable", False):
        from epdctl.runtime.servers.switchable import run_switchable
        await run_switchable(args, build_parser().parse_args)
    elif args.role == "encoder":
        from epdctl.runtime.servers.encoder import run_encoder
        await run_encoder(args)
    elif args.role == "prefill":
        from epdctl.runtime.servers.prefill import run_prefill
        await run_prefill(args)
    elif args.role == "decode":
        from epdctl.runtime.servers.decode import run_decode
        await run_decode(args)
    else:
        from epdctl.runtime.servers.colocated import run_colocated
        await run_colocated(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s {args.role} %(levelname)s %(name)s: %(message)s")
    problem = preflight(args)
    if problem is None:
        from epdctl.runtime.placement import apply as place
        problem = place(args.cpus, args.threads)
    if problem is None:
        from epdctl.runtime.errors import RuntimeWorkerError
        try:
            asyncio.run(_run(args))
            log.info("stopped")
            return 0
        except RuntimeWorkerError as exc:
            problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        except KeyboardInterrupt:
            return 130
    print(f"epdctl.runtime {args.role}: error: {problem}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    code = main()
    # Everything was closed explicitly; skip interpreter teardown, which spends seconds
    # garbage-collecting torch/transformers objects and would delay a graceful stop.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
