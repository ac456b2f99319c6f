"""Flags across SGLang releases: resolve what SGLang's launcher accepts to canonical names, and
migrate removed or deprecated flags to the installed release's equivalents.

The table (``flags/sglang_migrations.json``) is built from SGLang's own source history; the
deprecated actions of the installed parser are in the parser dump (``flags/sglang.json``). Both
``validate`` (warnings, ``--fix``) and ``epdctl import`` use :func:`migrate_args`.
"""

from __future__ import annotations

from dataclasses import dataclass

from epdctl.topology.engine_flags import FlagTable, flag_table
from epdctl.topology.migration_table import Migration, migration_table

__all__ = ["Applied", "Migration", "canonical_args", "canonical_flag", "migrate_args", "migration_table"]


@dataclass(frozen=True)
class Applied:
    """One rewrite: ``old`` tokens became ``new`` (``migration`` is None for a spelling fix)."""

    old: tuple[str, ...]
    new: tuple[str, ...]
    migration: Migration | None
    reason: str

    def describe(self) -> str:
        why = self.migration.why() if self.migration is not None else self.reason
        return f"{' '.join(self.old)} -> {' '.join(self.new) or '(dropped)'} ({why})"


def canonical_flag(table: FlagTable, flag: str) -> str | None:
    """The name epdctl renders for ``flag`` as SGLang's launcher would read it: an exact spelling
    or alias, or a unique prefix (argparse's allow_abbrev); None if unknown or ambiguous."""
    opt = table.options.get(flag)
    if opt is None:
        hits = {o for name, o in table.options.items() if name.startswith(flag) and flag.startswith("--")}
        if len(hits) != 1 or len([n for n in table.options if n.startswith(flag)]) != 1:
            return None
        opt = hits.pop()
    own = "--" + opt.dest.replace("_", "-")
    return own if own in opt.flags else max(opt.flags, key=len)


def ambiguous(table: FlagTable, flag: str) -> list[str]:
    """Every option a prefix could mean (argparse refuses an ambiguous prefix)."""
    return sorted(n for n in table.options if n.startswith(flag)) if flag.startswith("--") else []


def _value_end(table: FlagTable, tokens: list[str], i: int) -> int:
    """Index after the values of the flag at ``tokens[i]`` (values never start with --)."""
    name = tokens[i].partition("=")[0]
    if "=" in tokens[i]:
        return i + 1
    opt = table.options.get(name)
    j = i + 1
    if opt is not None and not opt.takes_value:
        return j
    while j < len(tokens) and not tokens[j].startswith("--"):
        j += 1
        if opt is not None and opt.nargs in (None, 1, "?"):
            break
    return j


def migrate_args(tokens: list[str] | tuple[str, ...], table_name: str = "sglang", *, apply_table: bool = True
                 ) -> tuple[list[str], list[Applied]]:
    """Rewrite ``tokens`` for the installed engine (its flag table ``table_name``): fix ``---flag``
    typos, expand prefixes and aliases to canonical names, apply the migration table (unless
    ``apply_table`` is False). Unknown flags are left alone; a table without migrations rewrites nothing."""
    if not migration_table(table_name):
        return list(tokens), []
    table = flag_table(table_name)
    moves = migration_table(table_name) if apply_table else {}
    toks = list(tokens)
    applied: list[Applied] = []
    out: list[str] = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        if not tok.startswith("--"):
            out.append(tok)
            i += 1
            continue
        if tok.startswith("---") and len(tok) > 3:
            fixed = "--" + tok.lstrip("-")
            applied.append(Applied((tok,), (fixed,), None, "typo: three dashes"))
            toks[i] = tok = fixed
        name, eq, inline = tok.partition("=")
        if name in moves:
            m = moves[name]
            end = i + 1
            if m.takes_value and not eq and end < len(toks) and not toks[end].startswith("--"):
                end += 1
            old = tuple(toks[i:end])
            if m.kind == "rename":
                new = [m.replacement[0] + (("=" + inline) if eq else "")]
            elif m.kind in ("dp_attention", "ep_from_tp"):
                new = []  # resolved below, once every flag is known
            else:
                new = list(m.replacement)
            applied.append(Applied(old, tuple(new) if m.kind not in ("dp_attention", "ep_from_tp") else (),
                                   m, m.summary()))
            out.extend(new)
            i = end
            continue
        canon = canonical_flag(table, name)
        if canon is not None and canon != name:
            applied.append(Applied((name,), (canon,), None, f"{name} is how SGLang's launcher reads {canon}; "
                                                             f"epdctl writes the full name"))
            tok = canon + (("=" + inline) if eq else "")
        out.append(tok)
        i += 1
    return _resolve_context(out, applied, table), applied


def _flag_value(tokens: list[str], flag: str) -> tuple[int, str | None]:
    for i, t in enumerate(tokens):
        if t == flag and i + 1 < len(tokens):
            return i, tokens[i + 1]
        if t.startswith(flag + "="):
            return i, t.split("=", 1)[1]
    return -1, None


def _resolve_context(out: list[str], applied: list[Applied], table: FlagTable) -> list[str]:
    """Migrations whose result depends on other flags (--dp-size for DP attention, --tp-size for EP)."""
    for k, a in enumerate(applied):
        m = a.migration
        if m is None or m.kind not in ("dp_attention", "ep_from_tp"):
            continue
        if m.kind == "dp_attention":
            at, dp = _flag_value(out, "--dp-size")
            if at >= 0 and dp is not None:
                width = 1 if "=" in out[at] else 2
                del out[at:at + width]
                new: tuple[str, ...] = ("--attn-dp-size", dp)
                out[at:at] = list(new)
                old = a.old + (("--dp-size", dp) if width == 2 else (f"--dp-size={dp}",))
            else:
                new, old = (), a.old  # no --dp-size: DP attention of width 1 is no DP attention
            applied[k] = Applied(old, new, m, m.summary())
        else:
            _, tp = _flag_value(out, "--tp-size")
            new = ("--ep-size", tp or "1")
            if _flag_value(out, "--ep-size")[0] < 0:
                out.extend(new)
            applied[k] = Applied(a.old, new, m, m.summary())
    return out


def canonical_args(tokens: tuple[str, ...] | list[str], table_name: str) -> list[str]:
    """``tokens`` with every flag the launcher would expand (a unique prefix) written in full."""
    table = flag_table(table_name)
    if not table.abbrev:
        return list(tokens)
    out = []
    for tok in tokens:
        if tok.startswith("--"):
            name, eq, inline = tok.partition("=")
            canon = canonical_flag(table, name)
            if canon is not None and canon != name and table.options.get(name) is None:
                tok = canon + (("=" + inline) if eq else "")
        out.append(tok)
    return out
