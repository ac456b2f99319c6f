"""The ``model:`` block: where the weights come from and where the engines read them.

Three sources: a local folder (``path: /models/x``), a folder on a shared filesystem (the same
``path:``, visible on every node), or a hub repository (``hf: ORG/NAME[@REVISION]``) that
`epdctl stage` downloads once into ``cache`` (HF_HOME, on storage every node sees). With
``stage: /local/nvme/x`` the weights are also copied to that folder on every node's own disk,
and the engines read the copy.

The engines' path for ``hf:`` is the snapshot folder of the hub cache layout
(``HF_HOME/hub/models--ORG--NAME/snapshots/COMMIT``); a branch or tag is turned into its commit
through ``refs/REVISION``, which the download writes.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from epdctl.topology.model import HubRef, Model
from epdctl.topology.reader import Reader

MODEL_KEYS = ("path", "hf", "cache", "stage", "served_name", "dtype", "architecture", "trust_remote_code")
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
# The hub's repository id rules (huggingface_hub.utils._validators): ORG/NAME, letters, digits,
# '-', '_', '.', at most 96 characters each, no '--' or '..', not starting or ending in '-' or '.'
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
HF_SPEC = re.compile(rf"^({_PART}/{_PART})(?:@([^\s@]+))?$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")


def parse_hub(text: str) -> HubRef | None:
    """``ORG/NAME`` or ``ORG/NAME@REVISION`` -> HubRef; None when it is not one."""
    m = HF_SPEC.match(text.strip())
    if m is None or "--" in m.group(1) or ".." in m.group(1):
        return None
    return HubRef(m.group(1), m.group(2) or "main")


def repo_folder(cache: str, hub: HubRef) -> Path:
    """The repository's folder in the hub cache under HF_HOME ``cache``."""
    return Path(cache) / "hub" / ("models--" + hub.repo.replace("/", "--"))


def snapshot_path(cache: str, hub: HubRef) -> Path:
    """Where the snapshot of ``hub`` is (or will be) in ``cache``: the commit the revision's ref
    names once downloaded; before that, the revision itself (a commit, or a placeholder)."""
    folder = repo_folder(cache, hub)
    commit = hub.revision
    if not COMMIT.match(commit):
        try:
            commit = (folder / "refs" / hub.revision).read_text().strip() or commit
        except OSError:
            pass
    return folder / "snapshots" / commit


def read_model(r: Reader, top: dict[str, Any]) -> Model | None:
    if "model" not in top:
        r.problem("", "missing required key 'model' (path or hf, served_name, dtype, architecture)")
        return None
    m = r.mapping(top.get("model"), "model", MODEL_KEYS, "model")
    if m is None:
        return None
    path = r.get(m, "model", "path", "str")
    spec = r.get(m, "model", "hf", "str")
    cache = r.get(m, "model", "cache", "str")
    stage = r.get(m, "model", "stage", "str")
    served = r.get(m, "model", "served_name", "str")
    dtype = r.get(m, "model", "dtype", "str", choices=DTYPES)
    arch = r.get(m, "model", "architecture", "str")
    trust = r.get(m, "model", "trust_remote_code", "bool", default=False)
    hub = None
    if path is not None and spec is not None:
        r.problem("model.hf", "model has both path and hf; give one: path (a folder) or hf (ORG/NAME[@REVISION])")
        return None
    if path is None and spec is None:
        if m.get("path") is None and m.get("hf") is None:
            r.problem("model", "model needs path (a folder of weights) or hf (ORG/NAME[@REVISION] on the hub)")
        return None
    if spec is not None:
        hub = parse_hub(spec)
        if hub is None:
            r.problem("model.hf", f"hf: {spec!r} is not a hub repository; write ORG/NAME or ORG/NAME@REVISION "
                                  "(e.g. Qwen/Qwen2-VL-2B-Instruct@main)")
            return None
        if cache is None:
            r.problem("model", "an hf: model needs model.cache: the HF_HOME folder it is downloaded into once, "
                               "on storage every node sees (e.g. /shared/hf)")
            return None
    elif cache is not None:
        r.problem("model.cache", "model.cache is the hub cache of an hf: model; a path: model is read "
                                 "where it is (remove cache, or name the model with hf:)")
    if stage is not None and not stage.startswith("/"):
        r.problem("model.stage", f"model.stage must be an absolute folder on each node's own disk (e.g. "
                                 f"/local/nvme/weights), got {stage!r}")
        stage = None
    # SGLang and vLLM name the model by the full --model-path when no served name is given;
    # an hf: model is served under its repository id
    name = path if hub is None else hub.repo
    return Model(path=path or "", served_name=served or name or "", hub=hub, cache=cache, stage=stage,
                 dtype=dtype, architecture=arch, trust_remote_code=trust)


def resolve(model: Model, base: Path | None) -> Model:
    """Relative folders against the topology file; ``origin`` and the engines' ``path`` set."""
    def absolute(p: str) -> str:
        if base is not None and (p.startswith("./") or p.startswith("../") or p in (".", "..")):
            return str((base / p).resolve())
        return p

    cache = absolute(model.cache) if model.cache else None
    origin = str(snapshot_path(cache, model.hub)) if model.hub and cache else absolute(model.path)
    path = model.stage or origin
    served = model.served_name if model.hub or model.served_name != model.path else path
    return replace(model, path=path, origin=origin, cache=cache, served_name=served)


__all__ = ["MODEL_KEYS", "parse_hub", "read_model", "resolve", "snapshot_path"]
