"""`epdctl schema`: print (or write, or check) the topology JSON Schema for editors and CI."""

from __future__ import annotations

from pathlib import Path

import click

from epdctl.errors import EpdctlError
from epdctl.topology.jsonschema_gen import dumps

COMMITTED = Path(__file__).resolve().parents[1] / "topology" / "topology.schema.json"


@click.command("schema")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the schema to this file instead of standard output.")
@click.option("--check", "check", is_flag=True,
              help=f"Exit 1 if the committed {COMMITTED.name} differs from the generated schema.")
def schema(output: Path | None, check: bool) -> None:
    """JSON Schema of the topology, generated from the validator's own readers.

    Reference it from a topology's first line for completion and checks in editors that use the
    YAML language server (VS Code, Neovim, Helix):

      # yaml-language-server: $schema=https://.../topology.schema.json  (or a relative path)
    """
    text = dumps()
    if check:
        current = COMMITTED.read_text(encoding="utf-8") if COMMITTED.exists() else ""
        if current != text:
            raise EpdctlError(f"{COMMITTED} is out of date; regenerate it with `epdctl schema -o {COMMITTED}`")
        click.echo(f"OK: {COMMITTED} matches the topology readers")
        return
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as e:
        raise EpdctlError(f"cannot write {output} ({e.strerror}); check the path") from None
    click.echo(f"wrote {output} ({len(text)} bytes)", err=True)
