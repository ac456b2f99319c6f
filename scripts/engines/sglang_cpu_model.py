"""The tiny model as SGLang 0.5.23 reads it: ``python3 sglang_cpu_model.py SRC DST``.

SGLang 0.5.23's Qwen2-VL vision tower reads ``vision_config.in_chans``
(``sglang/srt/models/qwen2_vl.py``); transformers 5 and the checkpoint's config.json name it
``in_channels``. DST holds relative links to every file of SRC but config.json, which is SRC's
with ``in_chans`` added. Idempotent: a second run changes nothing. Prints nothing; exits 1 with
one line on stderr when SRC is not a Qwen2-VL checkpoint folder.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(src: Path, dst: Path) -> int:
    try:
        cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
        cfg["vision_config"]["in_chans"] = cfg["vision_config"]["in_channels"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"sglang-cpu: {src}/config.json has no vision_config.in_channels to copy ({e})", file=sys.stderr)
        return 1
    dst.mkdir(parents=True, exist_ok=True)
    names = {f.name for f in src.iterdir() if f.name != "config.json"}
    for f in dst.iterdir():  # files the source no longer has
        if f.name != "config.json" and f.name not in names:
            f.unlink()
    for name in sorted(names):
        link, target = dst / name, os.path.relpath(src / name, dst)
        if link.is_symlink() and os.readlink(link) == target:
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    text = json.dumps(cfg, indent=2) + "\n"
    config = dst / "config.json"
    if not config.exists() or config.read_text(encoding="utf-8") != text:
        config.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
