"""Text rendering of `epdctl status` and of `up`'s progress and canary (printing lives here)."""

from __future__ import annotations

import sys
from typing import Any

import click

from epdctl.containers.base import short_id
from epdctl.orchestrate.lifecycle import Event
from epdctl.orchestrate.observe import ClusterView


def fmt_uptime(seconds: float | None) -> str:
    """12s, 3m04s, 2h05m."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _health_cell(w: Any) -> tuple[str, str | None]:
    if w.alive is None:
        return "UNREACHABLE", "red"
    if not w.alive:
        return "DEAD", "red"
    if w.healthy:
        return "healthy", "green"
    return w.health, "yellow"


def _num(v: Any, fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def fmt_bytes(n: float | None) -> str:
    """1.2MB, 340kB, 12B."""
    if n is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}B"


_FIG_HEAD = ("", "REQS", "TTFT p50/p99 ms", "TPOT p50 ms", "CACHE HIT", "SENT")


def _fig_cells(name: str, f: dict[str, Any] | None) -> tuple[str, ...]:
    if f is None:
        return (name, "-", "-", "-", "-", "-")
    ttft = ("-" if f["ttft_p50_ms"] is None
            else f"{f['ttft_p50_ms']:.0f}/{_num(f['ttft_p99_ms'])}")
    return (name, _num(f["requests"]), ttft, _num(f["tpot_p50_ms"], "{:.1f}"),
            _num(f["cache_hit_rate"], "{:.0%}"), fmt_bytes(f["bytes_sent"]))


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(head[i]), *(len(r[i]) for r in rows)) if rows else len(head[i])
              for i in range(len(head))]
    return ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip()
            for r in (head, *rows)]


def job_line(job: str, owned: bool) -> str:
    """The SLURM job a cluster runs in, and who ends it."""
    if owned:
        return (f"SLURM job {job} submitted: it holds the nodes until `epdctl down` cancels it "
                f"(squeue -j {job}; scancel {job} ends the cluster)")
    return (f"running inside SLURM allocation {job} ($SLURM_JOB_ID): `epdctl down` stops the "
            f"workers' steps and leaves the job to its owner")


def render_figures(view: ClusterView) -> list[str]:
    """The second table: per worker, per role and the router (cumulative since start)."""
    rows = [_fig_cells(w.name, w.figures) for w in view.workers if w.role != "router"]
    rows += [_fig_cells(f"all {role} ({f['workers']})", f)
             for role, f in view.role_figures().items()]
    if view.router_figures is not None:
        rows.append(_fig_cells("router", {**view.router_figures, "ttft_p99_ms": None,
                                          "tpot_p50_ms": None, "cache_hit_rate": None,
                                          "bytes_sent": None}))
    if not rows:
        return []
    return ["", "figures (cumulative since each process started; - = no /metrics):",
            *_table(("WORKER", *_FIG_HEAD[1:]), rows)]


def render_status(view: ClusterView, color: bool = True) -> str:
    """The table, per-role summary lines and the log tails of dead workers."""
    head = ("WORKER", "ROLE", "NODE", "PID", "UPTIME", "HEALTH", "RESTARTS", "RUN/WAIT", "ROUTER")
    rows: list[tuple[tuple[str, ...], str | None]] = []
    for w in view.workers:
        health, colour = _health_cell(w)
        load = f"{w.load.running}/{w.load.waiting}" if w.load else "-"
        rows.append(((w.name, w.role, w.node, str(w.pid), fmt_uptime(w.uptime_s), health,
                      str(w.restarts), load, w.router), colour))
    widths = [max(len(head[i]), *(len(r[i]) for r, _ in rows)) if rows else len(head[i])
              for i in range(len(head))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(widths[i]) for i, c in enumerate(cells)).rstrip()

    out = [f"cluster {view.name}  ({view.phase}, launcher {view.launcher}, {view.topology})"]
    out += [f"  {view.problem}"] if view.problem else []
    if view.allocation is not None:
        a = view.allocation
        out.append(f"  SLURM job {a['job']} ({a['state']}, "
                   f"{'submitted by epdctl' if a.get('owned', True) else 'adopted: its owner ends it'})")
    out += [f"  {node}: unreachable: {why} (its workers' state is unknown)"
            for node, why in view.unreachable.items()]
    out += ["", line(head)]
    for cells, colour in rows:
        text = line(cells)
        out.append(click.style(text, fg=colour) if color and colour != "green" else text)
    out.append("")
    for role, (ready, total) in view.summary().items():
        mark = "ready" if ready == total else "NOT READY"
        out.append(f"{role:<9} {ready}/{total} {mark}")
    if view.router_ready is not None:
        state = "ready" if view.router_ready else "NOT READY"
        out.append(f"router view: {state}" + (f" ({view.router_detail})"
                                              if view.router_detail else ""))
    out += render_figures(view)
    images: dict[str, list[str]] = {}
    for w in view.workers:
        if w.image:
            images.setdefault(w.image + (f" ({short_id(w.image_digest)})" if w.image_digest else ""),
                              []).append(w.name)
    if images:
        out += ["", "containers:"] + [f"  {image}: {', '.join(names)}" for image, names in images.items()]
    restarted = [w for w in view.workers if w.last_exit]
    if restarted:
        out += ["", "last exits (the supervisor restarts a worker that dies after it was healthy):"]
        out += [f"  {w.name}: {w.last_exit}; restarted {w.restarts} time(s)" for w in restarted]
    for w in view.workers:
        if w.alive is False:
            out += ["", f"--- {w.name} is dead; last lines of {w.log}:",
                    w.log_tail or "(log is empty)"]
    return "\n".join(out)


class Progress:
    """`up`'s progress: one updating line per stage on a terminal, plain lines otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self._open = False
        self._last_detail = ""

    def __call__(self, e: Event) -> None:
        if e.kind == "starting":
            self._end()
            click.echo(f"starting {e.stage} ({e.total}) ..." + (f" {e.detail}" if e.detail else ""))
        elif e.kind == "progress":
            if self.tty:
                click.echo(f"\r  waiting: {e.detail} ({e.elapsed:.0f}s)\x1b[K", nl=False)
                self._open = True
        elif e.kind == "waiting" and self.tty:
            pass  # the "progress" line shows every role at once
        elif e.kind == "waiting" and e.detail and e.detail != self._last_detail:
            click.echo(f"  {e.stage}: {e.detail} ({e.elapsed:.0f}s)")  # e.g. a job's queue state
            self._last_detail = e.detail
        elif e.kind == "ready":
            self._end()
            click.echo(f"  {e.stage}: {e.ready}/{e.total} ready in {e.elapsed:.1f}s")
        elif e.kind == "registered":
            self._end()
            click.echo(f"  registered {e.detail}")
        elif e.kind == "worker":  # a waiting worker's last meaningful log line
            self._end()
            click.echo(f"  {fmt_uptime(e.elapsed):>6}  {e.detail}")
        elif e.kind == "node":
            self._end()
            click.secho(f"  node {e.stage}: {e.detail}", fg="yellow")

    def _end(self) -> None:
        if self._open:
            click.echo("")
            self._open = False


def _printable(text: str) -> str:
    """One line, control characters escaped (an untrained model emits arbitrary tokens)."""
    if text and not text.strip():
        return f"(only whitespace, {len(text)} characters)"
    text = text.strip().replace("\n", " | ")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _misses(misses: list[Any], model: str) -> list[str]:
    """One line per wrong image, then what the pattern points at (``model``: the served name)."""
    out = []
    for m in misses:
        pictures = ", ".join(map(str, m.lent_by))
        lent = (f" (the item of Picture {pictures}, same colour)" if m.same_colour_copy
                else f" (the item of Picture {pictures})" if m.lent_by else "")
        out.append(f"  miss:     Picture {m.picture}: {m.want}, not named" if m.got is None
                   else f"  miss:     Picture {m.picture}: {m.want} read as {m.got}{lent}")
    if not misses:
        return out
    if not all(m.same_colour_copy for m in misses):
        return out + ["  reading:  a wrong colour, an unnamed picture or another picture's whole item is not the\n"
                      "            tiny model's usual miss: check the transfers with `epdctl check --canary CLUSTER`"]
    whose = ("the bundled\n            tiny model's known miss (docs/model.md)" if "tiny-qwen2vl" in model
             else "a reading\n            miss of the model")
    return out + [f"  reading:  each miss took the shape of another picture of the same colour: {whose};\n"
                  "            a wrong colour or an unnamed picture would point at the pipeline"]


def render_canary(res: Any) -> str:
    """Question, answer, verdict and per-stage timings of a canary run."""
    verdict = ("correct" if res.correct
               else f"NOT correct ({res.named}/{res.n_images} images named right)")
    out = [f"canary: {res.n_images}-image request through the router, model {res.model}",
           f"  question: {res.question}",
           "  expected: " + res.expected.replace("\n", " | "),
           "  answer:   " + (_printable(res.answer)[:300] or "(empty)"),
           f"  verdict:  {verdict}  ({res.seconds * 1000:.0f} ms end to end)"]
    out += _misses(res.misses, res.model)
    if res.timings:
        cells = []
        for k, v in res.timings.items():
            if k.startswith("t_"):  # the workers' wall-clock stamps: for benchmarks/epd_stages.py
                continue
            if isinstance(v, float):
                v = f"{v:.1f}"
            cells.append(f"{k}={v}")
        out.append("  timings:  " + " ".join(cells))
    return "\n".join(out)
