"""The `epdctl` command group and the single error boundary.

Commands live in ``epdctl/commands/``; each module exposes one click command (or a few) that
this file registers. Importing this module must stay cheap: no torch, no paramiko at import.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from epdctl import __version__
from epdctl.errors import EpdctlError

# (module under epdctl.commands, attribute) for every command; imported lazily so that
# `epdctl --help` and `epdctl validate` never pay for what other commands import.
_COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("validate", "validate"),
    "render": ("render", "render"),
    "up": ("cluster", "up"),
    "status": ("cluster", "status"),
    "down": ("down", "down"),
    "logs": ("cluster", "logs"),
    "check": ("check", "check"),
    "rebalance": ("rebalance", "rebalance"),
    "history": ("rebalance", "history"),
    "bench": ("bench", "bench"),
    "profile": ("plan", "profile"),
    "plan": ("plan", "plan"),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, (mod, _) in _COMMANDS.items() if _module_exists(mod))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in _COMMANDS:
            return None
        mod, attr = _COMMANDS[name]
        if not _module_exists(mod):
            return None
        return getattr(importlib.import_module(f"epdctl.commands.{mod}"), attr)


def _module_exists(mod: str) -> bool:
    return importlib.util.find_spec(f"epdctl.commands.{mod}") is not None


@click.group(cls=_LazyGroup)
@click.version_option(__version__, prog_name="epdctl")
def cli() -> None:
    """Deploy, check and rebalance Encoder-Prefill-Decode disaggregated VLM serving."""


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the CLI, turning EpdctlError into a message and exit 1."""
    try:
        # Non-standalone mode returns the exit code of ctx.exit(n) instead of raising it.
        rc = cli.main(args=argv, prog_name="epdctl", standalone_mode=False)
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except EpdctlError as e:
        click.secho(f"error: {e}", fg="red", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
