"""Every flag an older SGLang release accepted and the installed 0.5.23 lacks has a named outcome
in the migration table (flags/sglang_migrations.json): its replacement, an equivalent under another
name, or "drop it" with the reason. The releases' flags (0.4.0 .. 0.5.22) are in
tests/fixtures/sglang/flags_by_release.json, read from their PyPI wheels by
scripts/sglang_removed_flags.py; the test walks them and the whole 0.5.23 flag table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epdctl.topology import topology_from_text
from epdctl.errors import TopologyError
from epdctl.topology.engine_flags import flag_table
from epdctl.topology.migrations import migrate_args, migration_table

RELEASES = json.loads((Path(__file__).parent / "fixtures" / "sglang" / "flags_by_release.json").read_text())
TABLE = flag_table("sglang")
MOVES = migration_table("sglang")
KNOWN = sorted(set().union(*map(set, RELEASES["releases"].values())))
REMOVED = [f for f in KNOWN if TABLE.options.get(f) is None]


def test_the_releases_span_0_4_to_0_5_22_and_many_flags_were_removed() -> None:
    assert {"0.4.0", "0.4.6.post5", "0.5.9", "0.5.13.post1", "0.5.22"} <= set(RELEASES["releases"])
    assert len(KNOWN) > 500 and len(REMOVED) >= 70


@pytest.mark.parametrize("flag", REMOVED)
def test_every_removed_flag_has_a_named_outcome(flag: str) -> None:
    m = MOVES.get(flag)
    assert m is not None, f"{flag}: no migration entry"
    assert m.kind in ("rename", "replace", "drop", "dp_attention", "ep_from_tp")
    assert m.evidence, flag
    if m.kind == "drop":
        assert m.note and not m.replacement, flag  # "dropped: reason"
    elif m.kind in ("rename", "replace"):
        new = TABLE.options.get(m.replacement[0])
        assert new is not None, (flag, m.replacement)
        if len(m.replacement) > 1 and new.choices:
            assert m.replacement[1] in new.choices, (flag, m.replacement)
    # applied to a command, the result is what 0.5.23's parser accepts (a rename keeps the value in place;
    # replace and drop consume the old flag's value when it took one)
    renamed = TABLE.options.get(m.replacement[0]) if m.kind == "rename" else None
    value = [(renamed.choices or ("7",))[0] if renamed is not None else "7"] \
        if m.takes_value or (renamed is not None and renamed.takes_value) else []
    out, applied = migrate_args(["--tp-size", "2", flag, *value, "--port", "30000"])
    assert applied and applied[0].migration is m
    assert TABLE.check(out) == [], (flag, out)


def test_the_whole_0_5_23_table_and_the_migration_table_agree() -> None:
    for flag in sorted(TABLE.options):
        m = MOVES.get(flag)
        assert m is None or m.status == "deprecated", f"{flag} is in 0.5.23's parser but migrated as removed"
    for flag, m in MOVES.items():
        if m.status == "removed":
            assert TABLE.options.get(flag) is None, flag
        assert m.summary().startswith(f"{flag} -> "), flag


def test_a_removed_eplb_flag_names_its_outcome_and_fix_drops_it(tmp_path: Path) -> None:
    text = ("name: t\nengine: sglang\nmodel: {path: m}\nnodes: [{name: n, host: 127.0.0.1, gpus: 1}]\n"
            "roles:\n  colocated:\n    workers:\n      - node: n\n"
            "        args: [--enable-expert-distribution-metrics, --ep-num-redundant-experts, 32]\n")
    with pytest.raises(TopologyError) as e:
        topology_from_text(text)
    msg = str(e.value)
    assert "--enable-expert-distribution-metrics was removed: --enable-expert-distribution-metrics -> drop it" in msg
    assert "0.5.13.post1" in msg and "--fix" in msg
    out, applied = migrate_args(["--enable-expert-distribution-metrics", "--ep-num-redundant-experts", "32"])
    assert out == ["--ep-num-redundant-experts", "32"] and len(applied) == 1
