"""`epdctl init`: ask the nodes what they have and write a first, commented topology."""

from __future__ import annotations

import os
import re
from pathlib import Path

import click

from epdctl.errors import EpdctlError, TopologyError
from epdctl.init import reach
from epdctl.init.compose import NodeIn, architecture, choose
from epdctl.init.inventory import inventory
from epdctl.init.write import SCHEMA_FILE, render


@click.command("init")
@click.option("--hosts", help="Machines to ask over SSH: a,b,c (name, address, user@host:port).")
@click.option("--ssh-config-hosts", "pattern", metavar="PATTERN",
              help="Ask every Host of ~/.ssh/config (or $EPDCTL_SSH_CONFIG) matching PATTERN, e.g. 'gpu-*'.")
@click.option("--slurm", "use_slurm", is_flag=True,
              help="Ask the nodes of the current SLURM allocation (run it under salloc or sbatch).")
@click.option("--model", "model_path", required=True, help="Model directory (or hub id) the topology serves.")
@click.option("--arch", help="Model architecture, e.g. Qwen2VLForConditionalGeneration (default: "
                             "from MODEL/config.json when readable here).")
@click.option("--engine", type=click.Choice(["sglang", "embedded"]),
              help="Default: sglang when every node has GPUs, else the embedded CPU runtime.")
@click.option("--tp", type=click.IntRange(1, 64), help="TP size of prefill/decode workers (default: from the "
                                                       "model size and GPU memory).")
@click.option("--name", help="Topology (cluster) name (default: from the output file name).")
@click.option("--python", default="python3", show_default=True, help="Interpreter on the nodes.")
@click.option("--setup", multiple=True, help="Shell line run on each node first (repeatable), e.g. "
                                             "'source /opt/venv/bin/activate'; written into the topology.")
@click.option("--ssh-key", help="Private key file for SSH (written into each node's ssh.key).")
@click.option("--accept-new-host-keys", is_flag=True, help="Trust and record host keys never seen before.")
@click.option("--skip-unreachable", is_flag=True, help="Write the topology from the nodes that answered.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Topology file to write (refuses to overwrite; use --force).")
@click.option("--force", is_flag=True, help="Overwrite --output.")
def init(hosts: str | None, pattern: str | None, use_slurm: bool, model_path: str, arch: str | None,
         engine: str | None, tp: int | None, name: str | None, python: str, setup: tuple[str, ...],
         ssh_key: str | None, accept_new_host_keys: bool, skip_unreachable: bool, output: Path, force: bool) -> None:
    """Read every node's GPUs and NICs (the `check` agent's probes) and write a valid topology."""
    if sum(bool(x) for x in (hosts, pattern, use_slurm)) != 1:
        raise click.UsageError("give exactly one of --hosts, --ssh-config-hosts or --slurm")
    if output.exists() and not force:
        raise EpdctlError(f"{output} exists; pass --force to overwrite it")
    pool = None
    if use_slurm:
        dests = reach.slurm_nodes(os.environ)
        names = {d: d for d in dests}
        runners = reach.slurm_runners(dests, python, setup)
        how = f"srun in SLURM job {os.environ.get('SLURM_JOB_ID', '?')}"
    else:
        from epdctl.launchers.ssh.nodes import options_from_env

        dests = reach.split_hosts(hosts) if hosts else reach.ssh_config_hosts(pattern or "", os.environ.get(
            "EPDCTL_SSH_CONFIG") or None)
        names = reach.node_names(dests)
        if ssh_key:
            from dataclasses import replace

            from epdctl.launchers.ssh.config import parse_destination
            dests_t = {d: replace(parse_destination(d, names[d]), key=ssh_key) for d in dests}
        else:
            dests_t = None
        runners, pool = reach.ssh_runners(dests, names, options_from_env(accept_new_host_keys or None), python,
                                          setup, targets=dests_t)
        how = "over SSH"
    click.echo(f"asking {len(runners)} node(s) {how} ...", err=True)
    try:
        found = reach.gather(runners, {names[d]: d for d in dests})
    finally:
        if pool is not None:
            pool.close()  # type: ignore[attr-defined]
    bad = [f"[{f.name}] {f.error}" for f in found if f.facts is None]
    for b in bad:
        click.secho(f"  {b}", fg="red", err=True)
    good = [NodeIn(f.name, f.host, inventory(f.facts)) for f in found if f.facts is not None]
    if bad and (not skip_unreachable or not good):
        raise EpdctlError(f"{len(bad)} of {len(found)} node(s) did not answer (listed above); fix them or pass "
                          f"--skip-unreachable to write the topology from the others")
    arch = architecture(model_path, arch)
    choice = choose(good, model_path, arch, engine, tp)
    schema = str(Path(__file__).resolve().parents[1] / SCHEMA_FILE)
    name = name or re.sub(r"[^A-Za-z0-9._-]", "-", output.stem) or "cluster"
    text = render(name, good, choice, model_path=model_path, arch=arch, launcher="slurm" if use_slurm else "ssh",
                  python=python, setup=setup, how=how, schema_path=schema, ssh_key=ssh_key,
                  partition=os.environ.get("SLURM_JOB_PARTITION"), missing=bad)
    _check(text, output)
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as e:
        raise EpdctlError(f"cannot write {output} ({e.strerror})") from None
    for f in good:
        nics = ", ".join(f"{n.name} {n.kind}" + (f" {n.speed_gbps:g}G" if n.speed_gbps else "") for n in f.inv.nics)
        click.echo(f"  {f.name}: {len(f.inv.gpus)} GPU(s); NICs: {nics or 'none'}")
    roles = ", ".join(f"{len(w)} {r}" for r, w in choice.roles.items() if w)
    click.secho(f"wrote {output}: engine {choice.engine}, {roles}; next: epdctl validate {output}", fg="green")


def _check(text: str, output: Path) -> None:
    """Never write a topology `validate` would reject."""
    from epdctl.render import build_plan
    from epdctl.topology import topology_from_text

    try:
        build_plan(topology_from_text(text, output.resolve()))
    except TopologyError as e:
        raise EpdctlError("init composed a topology that does not validate (a bug; please report it):\n"
                          + "\n".join(f"  {p.format(str(output))}" for p in e.problems)) from None
