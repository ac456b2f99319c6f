"""`epdctl import FILE... [-o topology.yaml]`: existing launch scripts -> a topology.

Reads SGLang (and vLLM) server and router commands from shell scripts, migrates old flags to
SGLang 0.5.23 (each migration listed), writes the topology with a comment at every guess and
reports how much of every input command `render` reproduces.
"""

from __future__ import annotations

from pathlib import Path

import click

from epdctl.errors import EpdctlError, Reported, TopologyError


@click.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=str))
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the topology here (default: print it).")
@click.option("--name", "name", default=None, help="Topology name (default: the first file's name).")
@click.option("--var", "variables", multiple=True, metavar="NAME=VALUE",
              help="Fill a ${NAME} placeholder the scripts leave open (repeatable).")
@click.option("--no-migrate", "no_migrate", is_flag=True,
              help="Keep flags older SGLang releases used (validate then names each replacement; --fix applies).")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
def import_(files: tuple[str, ...], output: Path | None, name: str | None, variables: tuple[str, ...],
            no_migrate: bool, force: bool) -> None:
    """Turn existing launch scripts (python -m sglang.launch_server ..., routers) into a topology."""
    from epdctl.importer import import_scripts
    from epdctl.importer.roundtrip import compare, load, summary

    values: dict[str, str] = {}
    for v in variables:
        key, eq, val = v.partition("=")
        if not eq or not key:
            raise click.BadParameter(f"{v!r}: give NAME=VALUE", param_hint="--var")
        values[key] = val
    if output is not None and output.exists() and not force:
        raise click.ClickException(f"{output} exists; pass --force to overwrite it")
    draft, text, _ = import_scripts(list(files), name, values, migrate=not no_migrate)
    for m in draft.migrations:
        click.echo(f"migrated {m}", err=True)
    for n in draft.notes:
        click.echo(f"note: {n}", err=True)
    if output is None:
        click.echo(text, nl=False)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as e:
            raise click.ClickException(f"cannot write {output} ({e.strerror})") from None
        click.echo(f"wrote {output}", err=True)
    try:
        _, problems = load(text)
        matched, total, wiring = summary(compare(draft, text))
    except TopologyError as e:
        click.secho(f"the imported topology does not validate yet ({len(e.problems)} problem(s)); run "
                    f"`epdctl validate` on it:", fg="yellow", err=True)
        for p in e.problems:
            click.echo(f"  {p.format(str(output) if output else None)}", err=True)
        raise Reported() from None
    except EpdctlError as e:
        click.secho(f"cannot render the imported topology: {e}", fg="yellow", err=True)
        raise Reported() from None
    pct = 100.0 * matched / total if total else 100.0
    click.echo(f"round trip: render reproduces {matched}/{total} input server flags ({pct:.1f}%), "
               f"multi-node wiring {'identical' if wiring else 'DIFFERENT'}", err=True)
    if problems:
        click.secho(f"the imported topology renders but does not validate ({len(problems)} problem(s)); complete "
                    f"it, then `epdctl validate`:", fg="yellow", err=True)
        for q in problems:
            click.echo(f"  {q}", err=True)
        raise Reported()
