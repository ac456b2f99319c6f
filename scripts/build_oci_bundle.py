#!/usr/bin/env python3
"""Build an OCI bundle (config.json + rootfs/) for SLURM's own containers (``srun --container=BUNDLE``,
``container.runtime: slurm-oci``) from a podman image, offline.

The rootfs is the image's filesystem (``podman create`` + ``podman export``); config.json starts
from ``runc spec`` and is made fit for a SLURM step: no network, UTS or IPC namespace (the host's,
as every anchor runs engines), no terminal, the open-files limit of this machine, the host's
/etc/hosts and /etc/resolv.conf, and bind mounts at their own paths (SLURM 22.05 cannot add
mounts to a step, so they live in the bundle): by default this checkout read-only (its venv, code
and model) and the venv's base interpreter (pyvenv.cfg ``home``), plus every ``--mount``. SLURM
fills in the process: the step's command, the job's user, cwd and environment.

Idempotent: a bundle built from the same image ID with the same mounts is kept (``--rebuild``
rebuilds). Prints one line of what it did. Needs root, podman and runc.

    sudo python3 scripts/build_oci_bundle.py            # -> .bundles/epdctl-runtime
    sudo python3 scripts/build_oci_bundle.py --image localhost/epdctl-runtime:bookworm \\
        --out /shared/bundles/epdctl-runtime --mount /scratch/models:/models:ro
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "localhost/epdctl-runtime:bookworm"
PODMAN = ["podman", "--cgroup-manager=cgroupfs", "--events-backend=file"]
STAMP = "epdctl-bundle.json"  # what the bundle was built from, beside config.json


def fail(msg: str) -> None:
    print(f"build_oci_bundle: {msg}", file=sys.stderr)
    raise SystemExit(1)


def run(argv: list[str], **kw: object) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        fail(f"{' '.join(argv)} failed (rc {proc.returncode}): {proc.stderr.strip()}")
    return str(proc.stdout)


def default_mounts() -> list[str]:
    """This checkout read-only, and the venv's base interpreter prefix (pyvenv.cfg ``home``)."""
    out = [f"{ROOT}:{ROOT}:ro"]
    try:
        cfg = (ROOT / ".venv" / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return out
    home = next((ln.split("=", 1)[1].strip() for ln in cfg if ln.split("=", 1)[0].strip() == "home"), None)
    if home:
        prefix = str(Path(home).parent)
        if prefix not in ("/usr", "/"):  # the image has its own /usr
            out.append(f"{prefix}:{prefix}:ro")
    return out


def mount_entry(text: str) -> dict[str, object]:
    parts = text.split(":")
    if len(parts) > 3 or not parts[0].startswith("/") or (len(parts) > 1 and parts[1] and not parts[1].startswith("/")):
        fail(f"--mount {text!r} is not SRC[:DST[:ro]] with absolute paths")
    src = parts[0]
    dst = parts[1] if len(parts) > 1 and parts[1] else src
    if not Path(src).exists():
        fail(f"--mount {text!r}: {src} does not exist on this machine")
    return {"destination": dst, "type": "bind", "source": src,
            "options": ["rbind", "ro" if parts[2:] == ["ro"] else "rw"]}


def config(spec: dict, mounts: list[str]) -> dict:
    spec["process"]["terminal"] = False
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    spec["process"]["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": hard, "soft": hard}]
    spec["root"] = {"path": "rootfs", "readonly": False}
    spec.pop("hostname", None)
    linux = spec["linux"]
    linux["namespaces"] = [n for n in linux["namespaces"] if n["type"] not in ("network", "uts", "ipc")]
    spec["mounts"] = [m for m in spec["mounts"] if m["destination"] not in ("/dev/mqueue",)]
    spec["mounts"] += [{"destination": p, "type": "bind", "source": p, "options": ["rbind", "ro"]}
                       for p in ("/etc/hosts", "/etc/resolv.conf") if Path(p).exists()]
    spec["mounts"] += [mount_entry(m) for m in mounts]
    return spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", default=IMAGE, help=f"podman image (default {IMAGE})")
    ap.add_argument("--out", default=str(ROOT / ".bundles" / "epdctl-runtime"), help="the bundle directory")
    ap.add_argument("--mount", action="append", default=[], metavar="SRC[:DST[:ro]]",
                    help="an extra bind mount baked into config.json (repeatable)")
    ap.add_argument("--no-default-mounts", action="store_true", help="only the --mount ones")
    ap.add_argument("--rebuild", action="store_true")
    args = ap.parse_args()
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            fail(f"{tool} is not installed (apt-get install podman runc)")
    out = Path(args.out).resolve()
    mounts = ([] if args.no_default_mounts else default_mounts()) + args.mount
    image_id = run([*PODMAN, "image", "inspect", "--format", "{{.Id}}", args.image]).strip() \
        if subprocess.run([*PODMAN, "image", "exists", args.image]).returncode == 0 else ""
    if not image_id:
        fail(f"no podman image {args.image}; build it first: sudo bash scripts/build_container_image.sh")
    want = {"image": args.image, "image_id": image_id, "mounts": mounts}
    try:
        have = json.loads((out / STAMP).read_text())
    except (OSError, ValueError):
        have = None
    if have == want and (out / "config.json").is_file() and (out / "rootfs").is_dir() and not args.rebuild:
        print(f"kept OCI bundle {out} ({args.image}, {image_id[:12]})")
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / "rootfs").mkdir()
        cid = run([*PODMAN, "create", args.image, "/bin/true"]).strip()
        try:
            export = subprocess.Popen([*PODMAN, "export", cid], stdout=subprocess.PIPE)
            untar = subprocess.run(["tar", "-x", "-C", str(tmp / "rootfs"), "--numeric-owner", "-f", "-"],
                                   stdin=export.stdout, capture_output=True, text=True)
            assert export.stdout is not None
            export.stdout.close()
            if export.wait() != 0 or untar.returncode != 0:
                fail(f"podman export {args.image} | tar -x failed: {untar.stderr.strip()}")
        finally:
            run([*PODMAN, "rm", "--force", cid])
        run(["runc", "spec", "--bundle", str(tmp)])
        spec = config(json.loads((tmp / "config.json").read_text()), mounts)
        (tmp / "config.json").write_text(json.dumps(spec, indent=2) + "\n")
        (tmp / STAMP).write_text(json.dumps(want, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"built OCI bundle {out} from {args.image} ({image_id[:12]}; mounts: {', '.join(mounts) or 'none'})")


if __name__ == "__main__":
    main()
