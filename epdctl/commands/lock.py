"""`epdctl diff A.lock B.lock`, and the lock steps of `up` (--lock, --locked)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import click

from epdctl.errors import EpdctlError, LaunchError, Reported
from epdctl.lockfile import diff as lockdiff
from epdctl.lockfile.build import build_lock

LOCK_NAME = "epdctl.lock"


def planned_lock(topo: Any, plan: Any, report: Any, run_dir: Path | None = None) -> dict[str, Any]:
    """The lock of what `up` is about to run (``report``: the preflight's, or None); the staged
    weights' manifest digest from the run folder, where `epdctl stage` wrote one."""
    digest = None
    if run_dir is not None and topo.model.stage:
        from epdctl.stage import MANIFEST_FILE
        from epdctl.stage.manifest import Manifest
        try:
            digest = Manifest.from_json((run_dir / MANIFEST_FILE).read_text()).digest
        except (OSError, ValueError, KeyError):
            digest = None
    return build_lock(topo, plan, report.facts if report is not None else None, digest,
                      report.images if report is not None else None)


def refuse_unless_locked(doc: dict[str, Any], locked: Path) -> None:
    """`up --locked FILE`: nothing starts when anything would differ from FILE."""
    want = lockdiff.read(locked)
    changes = lockdiff.diff(want, doc)
    if doc.get("nodes") is None and want.get("nodes") is not None:
        raise LaunchError(f"--locked {locked}: the node facts it pins (versions, GPUs, driver, "
                          "NICs) come from the preflight, which did not run; drop --skip-preflight")
    if changes:
        raise LaunchError(f"nothing was started: this run would differ from {locked} in "
                          f"{len(changes)} field(s) (- locked, + now):\n{lockdiff.render(changes)}\n"
                          "make the nodes and topology match it, or run without --locked")
    click.echo(f"lock: matches {locked}")


def write_lock(doc: dict[str, Any], run_dir: Path, copy_to: Path | None) -> Path:
    path = run_dir / LOCK_NAME
    lockdiff.write(doc, path)
    if copy_to is not None:
        try:
            shutil.copyfile(path, copy_to)
        except OSError as e:
            raise EpdctlError(f"cannot write the lock to {copy_to}: {e.strerror or e} (it is in "
                              f"{path})") from e
    return path


@click.command("diff")
@click.argument("first", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("second", type=click.Path(dir_okay=False, path_type=Path))
def diff(first: Path, second: Path) -> None:
    """Show every field that changed between two epdctl.lock files (exit 1 when any did)."""
    changes = lockdiff.diff(lockdiff.read(first), lockdiff.read(second))
    if not changes:
        click.echo(f"no differences between {first} and {second}")
        return
    click.echo(f"{len(changes)} field(s) differ (- {first}, + {second}):")
    click.echo(lockdiff.render(changes))
    raise Reported()
