"""`epdctl bench [CLUSTER|URL]`: load a cluster (or any OpenAI endpoint) and report latency.

Streams multi-image chat requests drawn from a workload (a YAML file and/or flags), prints a
live progress line, then TTFT/TPOT/end-to-end percentiles, throughput, errors and, for an
epdctl cluster, per-stage times and what the workers' metrics say moved during the run.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from epdctl.errors import EpdctlError
from epdctl.bench.workload import Workload, WorkloadError, load_workload, parse_images


def _rates(text: str | None) -> list[float]:
    if not text:
        return []
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected rates like 0.5,1,2") from None
    if not rates or any(r <= 0 for r in rates):
        raise click.BadParameter(f"{text!r}: every rate must be > 0")
    return rates


class _ProgressLine:
    """One rewritten stderr line: done/sent, errors, elapsed (at most ~4 updates a second)."""

    def __init__(self, label: str):
        self.label = label
        self.last = 0.0
        self.tty = sys.stderr.isatty()

    def __call__(self, done: int, sent: int, errors: int, elapsed: float) -> None:
        now = time.monotonic()
        if now - self.last < 0.25 and self.tty:
            return
        self.last = now
        line = f"{self.label}: {done}/{sent} done, {errors} errors, {elapsed:5.1f}s"
        if self.tty:
            click.echo("\r" + line + "   ", nl=False, err=True)
        elif done % 5 == 0:
            click.echo(line, err=True)

    def close(self) -> None:
        if self.tty:
            click.echo("", err=True)


def build_workload(path: Path | None, **flags: Any) -> Workload:
    """A workload file (or the defaults) with command-line flags on top.

    A --rate on the command line replaces a file's concurrency and vice versa: the two are
    different arrival processes, never combined.
    """
    w = load_workload(path) if path else Workload(name="cli")
    images = flags.pop("images")
    if images is not None:
        flags["images"] = parse_images(int(images) if images.isdigit() else images, "--images")
    if flags.get("rate") is not None:
        w = replace(w, concurrency=None)
    elif flags.get("concurrency") is not None:
        w = replace(w, rate=None)
    w = w.with_(**flags)
    if w.rate is None and w.concurrency is None:
        raise WorkloadError("say how to load the server: --rate R (Poisson requests/s) or "
                            "--concurrency C (requests in flight), or set one in the workload")
    if w.requests is None and w.duration is None:
        raise WorkloadError("say when to stop: --requests N or --duration S")
    return w


def run_once(resolved: Any, w: Workload, label: str, quiet: bool) -> tuple[list, dict]:
    from epdctl.http import metrics
    from epdctl.bench import client, report

    before = metrics.scrape(resolved.endpoints, api_key_env=resolved.api_key_env)
    bar = _ProgressLine(label) if not quiet else None
    samples, wall = client.run(resolved.target, w, bar)
    if bar:
        bar.close()
    d = metrics.delta(before, metrics.scrape(resolved.endpoints, api_key_env=resolved.api_key_env))
    rep = report.summarize(samples, wall, workload=w.describe(), target=resolved.target.base_url,
                           offered_rate=w.rate, concurrency=w.concurrency, metrics=d,
                           stage_means=metrics.stage_means(d))
    return samples, rep


@click.command("bench")
@click.argument("target", required=False)
@click.option("--workload", "workload_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Workload YAML (benchmarks/workloads/*.yaml); flags override its keys.")
@click.option("--images", help="Images per request: 4, or a range 4-8 (uniform).")
@click.option("--repeat", type=float, help="Share of images repeated from earlier requests.")
@click.option("--rate", type=float, help="Poisson arrivals, requests/s (open loop).")
@click.option("--concurrency", type=int, help="Requests in flight (closed loop).")
@click.option("--duration", type=float, help="Seconds to send for.")
@click.option("--requests", type=int, help="Number of requests to send.")
@click.option("--max-tokens", type=int, help="Output tokens asked for per request.")
@click.option("--ignore-eos", is_flag=True, default=None,
              help="Every answer runs to --max-tokens (decode-bound load).")
@click.option("--seed", type=int, help="Seed of the request generator (same seed, same bytes).")
@click.option("--sweep", help="Comma-separated rates; one run per rate (overrides --rate).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the full report (and every request's sample) to this file.")
@click.option("--plot", "plot_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write latency CDFs (and throughput vs rate for --sweep) to this PNG.")
@click.option("--model", help="Model name to request (default: the cluster's or /v1/models).")
@click.option("--api-key-env", help="Env var holding the bearer key (default: the cluster's).")
@click.option("--metrics-url", multiple=True, help="Extra Prometheus page to diff (repeatable).")
@click.option("-q", "--quiet", is_flag=True, help="No progress line.")
def bench(target: str | None, workload_file: Path | None, images: str | None,
          repeat: float | None, rate: float | None, concurrency: int | None,
          duration: float | None, requests: int | None, max_tokens: int | None,
          ignore_eos: bool | None, seed: int | None, sweep: str | None, json_out: Path | None, plot_out: Path | None,
          model: str | None, api_key_env: str | None, metrics_url: tuple[str, ...],
          quiet: bool) -> None:
    """Benchmark CLUSTER (default: the only recorded one) or an OpenAI-compatible URL."""
    from epdctl.bench.report import format_report
    from epdctl.bench.target import resolve

    rates = _rates(sweep)
    w = build_workload(workload_file, images=images, repeat=repeat,
                       rate=rates[0] if rates else rate, concurrency=None if rates else concurrency,
                       duration=duration, requests=requests, max_tokens=max_tokens,
                       ignore_eos=ignore_eos or None, seed=seed)
    resolved = resolve(target, model=model, api_key_env=api_key_env, metrics_urls=metrics_url)
    click.echo(f"bench {resolved.target.base_url} model {resolved.target.model}; "
               f"{len(resolved.endpoints)} metrics page(s)")
    runs: list[tuple[str, list, dict]] = []
    for r in [*rates] if rates else [None]:
        wr = w.with_(rate=r) if r is not None else w
        label = f"rate {wr.rate:g}/s" if wr.rate is not None else f"concurrency {wr.concurrency}"
        click.echo(wr.describe())
        samples, rep = run_once(resolved, wr, label, quiet)
        for line in format_report(rep):
            click.echo(line)
        runs.append((label, samples, rep))
    if json_out:
        doc = {"runs": [{**rep, "label": label, "samples": [s.to_dict() for s in samples]}
                        for label, samples, rep in runs]}
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(doc, indent=1))
        click.echo(f"wrote {json_out}")
    if plot_out:
        from epdctl.bench.plot import plot_runs

        plot_runs(runs, plot_out, title=f"epdctl bench {resolved.target.base_url}")
        click.echo(f"wrote {plot_out}")
    from epdctl.bench.client import ZERO_TOKENS

    empty = sum(rep["error_kinds"].get(ZERO_TOKENS, 0) for _, _, rep in runs)
    if empty:
        raise EpdctlError(f"{empty} response(s) generated 0 tokens: the pipeline answers without "
                          "decoding (KV or embeddings not arriving; on GPUs a missing nvidia_peermem); "
                          "check the transfers with `epdctl check --canary`")
    if all(rep["ok"] == 0 for _, _, rep in runs):
        raise EpdctlError("no request succeeded; see the errors above")
