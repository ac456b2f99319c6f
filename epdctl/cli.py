"""The `epdctl` command group and the single error boundary.

Commands live in ``epdctl/commands/``; each module exposes one click command (or a few) that
this file registers. Importing this module must stay cheap: no torch, no paramiko at import.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import click

from epdctl import __version__
from epdctl.errors import EpdctlError, Reported

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
    "diagnose": ("diagnose", "diagnose"),
    "rebalance": ("rebalance", "rebalance"),
    "history": ("rebalance", "history"),
    "bench": ("bench", "bench"),
    "profile": ("plan", "profile"),
    "plan": ("plan", "plan"),
    "schema": ("schema", "schema"),
    "init": ("init", "init"),
    "import": ("import_cmd", "import_"),
    "stage": ("stage", "stage"),
    "diff": ("lock", "diff"),
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

    def invoke(self, ctx: click.Context) -> object:
        """A command that raised ``Reported`` has shown its outcome: only its exit code is left."""
        try:
            return super().invoke(ctx)
        except Reported as e:
            ctx.exit(e.exit_code)


def _module_exists(mod: str) -> bool:
    return importlib.util.find_spec(f"epdctl.commands.{mod}") is not None


@click.group(cls=_LazyGroup)
@click.version_option(__version__, prog_name="epdctl")
def cli() -> None:
    """Deploy, check and rebalance Encoder-Prefill-Decode disaggregated VLM serving."""


def main(argv: list[str] | None = None) -> None:
    """Console entry point, the single error boundary: an EpdctlError is its message and exit 1; any
    other exception is one line naming the debug log that holds its traceback, and exit 1."""
    try:
        _run(argv)
    except SystemExit:
        raise
    except BrokenPipeError:  # `epdctl status | head`: the reader left; nothing more to say
        _quiet_stdout()
        sys.exit(1)
    except Exception as e:  # the boundary: never a traceback on the terminal
        from epdctl.debuglog import printable, write_debug_log

        where = write_debug_log(e, list(sys.argv if argv is None else ["epdctl", *argv]))
        detail = printable(f"{type(e).__name__}: {e}", 200)
        see = f"the full traceback is in {where}" if where else "no debug log could be written"
        _say(f"error: unexpected internal error ({detail}); {see}. Please include it in a bug report.")
        sys.exit(1)


def _say(text: str) -> None:
    """One message on stderr, even where the terminal cannot encode it (lone surrogates are escaped)."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    try:
        click.secho(text, fg="red", err=True)
    except UnicodeEncodeError:  # a terminal that is not UTF-8
        click.secho(text.encode("ascii", "backslashreplace").decode("ascii"), fg="red", err=True)


def _quiet_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _run(argv: list[str] | None) -> None:
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
        if str(e):
            _say(f"error: {e}")
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
