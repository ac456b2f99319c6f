"""``python -m epdctl.runtime {encoder,prefill,decode,colocated} ...``: start one worker.

The command line is the contract with epdctl's control plane (docs/architecture.md). A worker
that cannot start (bad model path, port in use) exits 1 with one line on stderr saying why;
SIGTERM stops it gracefully (encoders unregister from their prefills first). Every worker runs
the reference path (plain torch and ZMQ) unless ``--fast`` (or ``EPD_RUNTIME_FAST=1``) selects
the fast one (``fast/``, paths.py); defaults live in config.py.
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
# decode starve a busy encoder (lab/benchmarks/bench_omp_wait.py compares the policies). A colocated
# worker is alone on its cores and keeps libgomp's default, which wakes faster. An
# OMP_WAIT_POLICY already in the environment wins.
if len(sys.argv) > 1 and sys.argv[1] in ("encoder", "prefill", "decode"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from epdctl.runtime.config import FAST_ENV, RuntimeConfig  # noqa: E402
from epdctl.runtime.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_IMAGES, add_limit_flags  # noqa: E402

log = logging.getLogger("epdctl.runtime")


def _opt(p: argparse.ArgumentParser, flag: str, cfg: RuntimeConfig, **kw: object) -> None:
    """``flag`` with its default (and type) from ``cfg``."""
    default = cfg.default(flag)
    if "type" not in kw and not isinstance(default, str):
        kw["type"] = type(default)
    p.add_argument(flag, default=default, **kw)  # type: ignore[arg-type]


def _common(p: argparse.ArgumentParser, cfg: RuntimeConfig, served: bool = True) -> None:
    p.add_argument("--model-path", required=True, help="local Hugging Face Qwen2-VL checkpoint folder")
    if served:
        p.add_argument("--served-model-name", default=None, help="model name clients use (default: folder name)")
    _opt(p, "--host", cfg)
    p.add_argument("--port", type=int, required=True)
    _opt(p, "--log-level", cfg)
    p.add_argument("--cpus", default=None, help="pin this worker to these CPU ids (e.g. 0,1 or 0-3); "
                                                "torch then runs one thread per pinned CPU")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: one per --cpus "
                                                            "CPU, else torch's default)")
    p.add_argument("--fast", action="store_true", default=cfg.fast,
                   help=f"run the fast path (epdctl/runtime/fast/: native copies and attention, packed GEMMs, "
                        f"shared-memory hand-offs, heap and GC tuning); default: the reference path, or "
                        f"{FAST_ENV}=1")


def _switchable(p: argparse.ArgumentParser) -> None:
    p.add_argument("--switchable", action="store_true",
                   help="load the whole model and accept POST /admin/switch_role (role change in place)")


def _transport(p: argparse.ArgumentParser, cfg: RuntimeConfig) -> None:
    _opt(p, "--transport", cfg, choices=["zmq", "zmq-ipc", "mooncake"])
    p.add_argument("--ib-device", default=None, help="RDMA device for --transport mooncake")
    _opt(p, "--transfer-port", cfg,
         help="port of this worker's transfer endpoint (0: any free port; epdctl renders one from the "
              "topology's port range)")


def _api_key(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-key-env", default=None, metavar="NAME",
                   help="environment variable holding the cluster's API key; the encoder registry, "
                        "the KV bootstrap, /metrics and POST /admin/switch_role then require it "
                        "(Authorization: Bearer KEY), and encoders and decodes send it to the prefills")


def build_parser(cfg: RuntimeConfig | None = None) -> argparse.ArgumentParser:
    cfg = cfg or RuntimeConfig.from_env()
    parser = argparse.ArgumentParser(prog="python -m epdctl.runtime", description=__doc__.splitlines()[0])
    roles = parser.add_subparsers(dest="role", required=True)

    enc = roles.add_parser("encoder", help="vision encoder worker")
    _common(enc, cfg, served=False)
    _transport(enc, cfg)
    _opt(enc, "--cache-mb", cfg, help="embedding cache size")
    _opt(enc, "--max-batch-size", cfg, help="images per vision-tower batch")
    _opt(enc, "--batch-wait-ms", cfg,
         help="how long an idle encoder waits for more requests to batch (requests that queue "
              "during a pass always share the next one)")
    enc.add_argument("--register-urls", nargs="+", default=[], help="prefill encoder-bootstrap URLs to join")
    add_limit_flags(enc, images=False)
    _api_key(enc)
    _switchable(enc)

    pre = roles.add_parser("prefill", help="prefill worker (calls the encoders, hands KV to the decode)")
    _common(pre, cfg)
    _transport(pre, cfg)
    add_limit_flags(pre)
    _api_key(pre)
    pre.add_argument("--bootstrap-port", type=int, required=True, help="KV bootstrap port (decodes connect here)")
    pre.add_argument("--encoder-bootstrap-port", type=int, required=True, help="encoder registry port")
    pre.add_argument("--encoder-urls", nargs="*", default=[], help="encoder worker URLs")
    _opt(pre, "--max-running-requests", cfg)
    _opt(pre, "--kv-timeout", cfg, help="seconds to wait for the decode of a room")
    _opt(pre, "--encoder-timeout", cfg, help="seconds per encoder call")
    _opt(pre, "--encoder-probe-interval", cfg, help="encoder health-probe period (0: off)")
    _switchable(pre)

    dec = roles.add_parser("decode", help="decode worker (continuous batching)")
    _common(dec, cfg)
    _transport(dec, cfg)
    _opt(dec, "--max-running-requests", cfg)
    _opt(dec, "--kv-timeout", cfg, help="seconds to wait for a room's KV")
    dec.add_argument("--max-images-per-request", type=int, default=DEFAULT_MAX_IMAGES, help="reported only; the prefill enforces it")
    dec.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="HTTP body size limit")
    _api_key(dec)  # its /metrics, its calls to the prefill's /kv/route, POST /admin/switch_role
    _switchable(dec)

    col = roles.add_parser("colocated", help="encoder+prefill+decode in one process")
    _common(col, cfg)
    add_limit_flags(col)
    _opt(col, "--max-running-requests", cfg)
    _opt(col, "--cache-mb", cfg)
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
    from epdctl.runtime.standby import wait_for_go
    if not wait_for_go(args.role, bool(getattr(args, "switchable", False)), args.cpus, args.threads):
        return 0  # a spare its supervisor no longer needs
    problem = preflight(args)
    if problem is None:
        from epdctl.runtime.placement import apply as place
        problem = place(args.cpus, args.threads)
    if problem is None:
        from epdctl.runtime import paths
        paths.select(args.fast)
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
