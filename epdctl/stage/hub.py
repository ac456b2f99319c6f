"""Download an ``hf:`` model once into the topology's shared cache with ``huggingface_hub``.

The download runs on the machine epdctl runs on (the login or control node), never on every
node: the nodes read the snapshot from the shared cache, or copy it to their own disks. The
hub client keeps the standard cache layout under ``HF_HOME/hub`` (blobs, snapshots, refs), so
an engine given HF_HOME finds the same files, a second `stage` finds them present (one
metadata call, no file fetched), and ``HF_ENDPOINT`` / ``HF_TOKEN`` work as everywhere else.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from epdctl.errors import StageError
from epdctl.stage.events import Downloaded
from epdctl.topology.model import HubRef


def download(hub: HubRef, cache: str) -> Downloaded:
    """Fetch what the cache lacks of ``hub`` into ``cache``/hub; the snapshot it resolved to."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError, \
            RevisionNotFoundError
    except ImportError:
        raise StageError("downloading an hf: model needs huggingface_hub on this machine: "
                         "pip install 'epdctl[hub]'") from None
    t0 = time.monotonic()
    where = f"hf:{hub} into {cache}"
    try:
        Path(cache, "hub").mkdir(parents=True, exist_ok=True)
        snapshot = snapshot_download(hub.repo, revision=hub.revision, cache_dir=str(Path(cache) / "hub"))
    except RevisionNotFoundError:
        raise StageError(f"downloading {where}: the hub has no revision {hub.revision!r} of {hub.repo}; "
                         f"fix model.hf (ORG/NAME@REVISION)") from None
    except RepositoryNotFoundError:
        raise StageError(f"downloading {where}: the hub has no repository {hub.repo} (or it is gated "
                         f"and HF_TOKEN is not set or not allowed); fix model.hf or export HF_TOKEN") from None
    except LocalEntryNotFoundError as e:
        raise StageError(f"downloading {where}: the hub cannot be reached and the cache does not hold it "
                         f"({_first_line(e)}); check HF_ENDPOINT / the network, or HF_HUB_OFFLINE") from None
    except HfHubHTTPError as e:
        raise StageError(f"downloading {where}: {_first_line(e)}") from None
    except OSError as e:
        raise StageError(f"downloading {where}: {e.strerror or e} ({getattr(e, 'filename', '') or cache})") \
            from None
    files, size = 0, 0
    for root, _, names in os.walk(snapshot, followlinks=True):
        for name in names:
            files += 1
            size += (Path(root) / name).stat().st_size
    return Downloaded(f"hf:{hub}", str(snapshot), Path(snapshot).name, files, size, time.monotonic() - t0)


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
