"""How the per-pair canary (`epdctl check --canary`) and the byte deltas of `up`'s canary read.

Why separate from the check table: the node/link table describes a topology before launch; this
one describes a running cluster's transfers, pair by pair, with the workers' own byte counts.
"""

from __future__ import annotations

from typing import Any, Sequence


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def render_pairs(report: Any, cluster: str) -> str:
    """One row per E->P and P->D pair: bytes the source sent and the destination received."""
    rows = [("KIND", "PAIR", "SENT", "RECEIVED", "REQUESTS", "RIGHT", "RESULT")]
    reasons = [""]
    for p in report.pairs:
        right = "-" if p.kind == "E->P" else f"{p.correct}/{p.requests}"
        rows.append((p.kind, p.label, human_bytes(p.sent), human_bytes(p.received),
                     str(p.requests), right, "ok" if p.ok else "FAIL"))
        reasons.append(p.reason if not p.ok else "")
    w = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    lines = [f"canary per pair, cluster {cluster} (bytes from each worker's /metrics)"]
    for row, why in zip(rows, reasons):
        text = "  ".join(row[k].ljust(w[k]) for k in range(len(row))).rstrip()
        lines.append(text + (f"  {why}" if why else ""))
    failed = [p.label for p in report.pairs if not p.ok]
    lines += ["", f"all {len(report.pairs)} pairs moved data" if not failed
              else f"{len(failed)} pair(s) failed: {', '.join(failed)}"]
    return "\n".join(lines)


def render_deltas(deltas: dict[str, Any], roles: dict[str, str]) -> str:
    """The bytes each worker moved during `up`'s canary (which part of them inline, when any)."""
    def amount(d: Any, i: int) -> str:
        inline = d[i + 2] if len(d) > 2 else 0
        if not inline:
            return human_bytes(d[i])
        return f"{human_bytes(d[i])} ({'all' if inline >= d[i] else human_bytes(inline)} inline)"

    cells = []
    for name, d in deltas.items():
        if d is None:
            cells.append(f"{name} (no /metrics)")
        elif d[0] or d[1]:
            what = {"encoder": f"sent {amount(d, 0)}",
                    "decode": f"received {amount(d, 1)}"}.get(
                roles.get(name, ""), f"received {amount(d, 1)}, sent {amount(d, 0)}")
            cells.append(f"{name} {what}")
    return "  transfers: " + ("; ".join(cells) or "none counted")


def missing_transfers(deltas: dict[str, Any], roles: dict[str, str]) -> list[str]:
    """What should have moved but did not: no encoder sent, or no decode received."""
    def moved(role: str, i: int) -> bool | None:
        vals = [d[i] for n, d in deltas.items() if roles.get(n) == role and d is not None]
        return any(v > 0 for v in vals) if vals else None

    out = []
    if moved("encoder", 0) is False:
        out.append("no encoder sent embedding bytes")
    if moved("decode", 1) is False:
        out.append("no decode received KV bytes")
    return out


def _table(rows: Sequence[tuple[str, ...]], reasons: list[str]) -> list[str]:
    w = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return ["  ".join(row[k].ljust(w[k]) for k in range(len(row))).rstrip()
            + (f"  {why}" if why else "") for row, why in zip(rows, reasons)]


def render_tokens(pairs: list[Any], cluster: str) -> str:
    """One row per prefill->decode pair: tokens matching the prefill-only run, KV bytes."""
    rows = [("KIND", "PAIR", "TOKENS", "MATCH", "KV BYTES", "RESULT")]
    reasons = [""]
    for p in pairs:
        n = len(p.tokens)
        match = n if p.first_mismatch is None else p.first_mismatch
        kv = "-" if p.kv_bytes is None else human_bytes(p.kv_bytes)
        rows.append(("P->D", p.label, str(n), f"{match}/{n}", kv, "ok" if p.ok else "FAIL"))
        reasons.append(p.reason)
    head = (f"token canary, cluster {cluster}: the decode's greedy tokens vs a prefill-only run "
            "of the same prefix (bootstrap_host 2.2.2.2)")
    return "\n".join([head, *_table(rows, reasons)])


def render_encoders(results: list[Any]) -> str:
    """SGLang encoders: embedding transfers counted by each encoder under image requests."""
    rows = [("KIND", "PAIR", "TRANSFERS", "ITEMS", "REQUESTS", "RESULT")]
    reasons = [""]
    for r in results:
        rows.append(("E->P", f"{r.name}->prefills", f"{r.transfers:g}", f"{r.items:g}",
                     str(r.requests), "ok" if r.ok else "FAIL"))
        reasons.append(r.reason)
    head = "encoders (sglang:encoder_transfer_seconds_count under image requests via the router)"
    return "\n".join([head, *_table(rows, reasons)])
