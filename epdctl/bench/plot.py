"""PNG figures of bench runs: latency CDFs, and throughput/latency against offered load.

matplotlib is imported here only (lazily, with the Agg backend: no display on servers), so
the rest of the CLI never pays for it. Input is the runs' samples and reports as
``epdctl bench`` collects them; several runs (a ``--sweep`` or a comparison) share one figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from epdctl.bench.client import Sample
from epdctl.errors import EpdctlError


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise EpdctlError("--plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax: Any, values: Sequence[float], label: str) -> None:
    xs = sorted(v * 1000.0 for v in values)
    if not xs:
        return
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    ax.step(xs, ys, where="post", label=label)


def plot_runs(runs: list[tuple[str, list[Sample], dict[str, Any]]], out: Path,
              title: str = "") -> Path:
    """Write one PNG: TTFT / TPOT / end-to-end CDFs per run and, for 2+ runs with an offered
    rate, achieved throughput and TTFT p50/p99 against that rate."""
    plt = _plt()
    sweep = [r for r in runs if r[2].get("offered_rate") is not None]
    ncols = 4 if len(sweep) >= 2 else 3
    fig, axes = plt.subplots(1, ncols, figsize=(5 * ncols, 4.2))
    for label, samples, _report in runs:
        ok = [s for s in samples if s.ok]
        _cdf(axes[0], [s.ttft for s in ok if s.ttft is not None], label)
        _cdf(axes[1], [s.tpot for s in ok if s.tpot is not None], label)
        _cdf(axes[2], [s.latency for s in ok if s.latency is not None], label)
    for ax, name in zip(axes[:3], ("TTFT", "TPOT", "end-to-end latency")):
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("share of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.set_title(f"{name} CDF")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if ncols == 4:
        ax = axes[3]
        rates = [r[2]["offered_rate"] for r in sweep]
        ax.plot(rates, [r[2]["throughput"]["requests_per_s"] for r in sweep], "o-",
                label="achieved req/s")
        ax.plot(rates, rates, ":", color="grey", label="offered")
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel("requests/s")
        ax2 = ax.twinx()
        for p, style in (("p50", "s--"), ("p99", "^--")):
            ax2.plot(rates, [r[2]["ttft_ms"][p] or float("nan") for r in sweep], style,
                     color="tab:red", label=f"TTFT {p}")
        ax2.set_ylabel("TTFT (ms)", color="tab:red")
        ax.set_title("throughput and TTFT vs load")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
