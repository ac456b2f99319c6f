"""Injection fuzzing of validate/render: hostile strings (shell metacharacters, newlines, a line
``EPD_CMD`` that would end the sbatch here-document, lone surrogates, NULs, ``${...}`` tricks) are
written into every string key and value of every example topology, several at a time.

Each mutated topology must either be refused with a TopologyError (a message, never a traceback)
or render. Every rendered script that carries a payload is then EXECUTED by bash: the plan
(`epdctl render` output) and, for SLURM topologies, the sbatch script, with stub binaries first on
PATH (python3, smg, srun, scontrol, curl, ...) that only record their argv (srun runs its step's
``bash -c`` command, so the per-worker commands run too). Every payload tries to create a file in
a canary folder; the folder must stay empty. Setup lines are exempt: they are shell commands by
design (and still one line each).
"""

from __future__ import annotations

import atexit
import copy
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epdctl.errors import EpdctlError, TopologyError
from epdctl.render import build_plan, to_shell
from epdctl.launchers.slurm.sbatch import render_sbatch
from epdctl.topology import topology_from_text

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "topologies").glob("*.yaml"))
EXAMPLES = [(p, yaml.safe_load(p.read_text())) for p in SOURCES]
WORK = Path(tempfile.mkdtemp(prefix="epd-fuzz-"))
atexit.register(shutil.rmtree, WORK, True)
CANARY = WORK / "canary"
CANARY.mkdir()
STUBS = WORK / "bin"
C = str(CANARY)

PAYLOADS = [
    f"x; touch {C}/semicolon", f"$(touch {C}/subst)", f"`touch {C}/backtick`", f"x\ntouch {C}/newline",
    f"x'\ntouch {C}/quote-newline\n'", f"a\nEPD_CMD\ntouch {C}/heredoc\n", f"${{IFS}}touch${{IFS}}{C}/ifs",
    f"x && touch {C}/and #", f'"; touch {C}/dquote; "', f"|touch {C}/pipe", f"&touch {C}/amp&", f">{C}/redirect",
    f"${{X:-$(touch {C}/default)}}", f"'$(touch {C}/sq)'", f"\\\"; touch {C}/bs #", f"x\rtouch {C}/cr",
    f"-o ProxyCommand=touch {C}/proxy", f"--flag=$(touch {C}/flag)", f"n0.slurm;touch {C}/host",
    "\ud800", "\udcff", "\x00", "\x1b[31m", "\u2028x", "名前", "a" * 300, "", "-", "${HOME}", "*", "~root",
]
PRINTABLE = [p for p in PAYLOADS if not any(ord(ch) < 32 or 0xD800 <= ord(ch) <= 0xDFFF for ch in p)]
STUB_NAMES = ["python", "python3", "smg", "sglang", "vllm", "scontrol", "curl", "nvidia-smi", "ibstat",
              "ibv_devinfo", "module", "srun", "sleep", "docker", "podman", "apptainer", "singularity", "runc"]
# Interpreters and engines that examples name by absolute path (the checkout's .venv, an engine venv
# under .engines/) run as the stubs of the same name: nothing real is started.
LOCAL_BINS = re.compile(re.escape(str(ROOT)) + r"/(?:\.venv|\.engines/[^/\s'\"]+)/bin/")


def _install_stubs() -> None:
    STUBS.mkdir(exist_ok=True)
    for name in STUB_NAMES:
        body = 'printf "%s\\0" "$0" "$@" >> "$STUB_LOG"; printf "\\n" >> "$STUB_LOG"\n'
        if name == "scontrol":
            body += ('if [ "$2" = hostnames ]; then for i in $(seq 0 63); do echo "n$i"; done; '
                     'else echo "NodeName=$4 NodeAddr=$4"; fi\n')
        elif name == "srun":  # run the step's `bash -c CMD` (its last arguments), as the real srun would
            body += 'while [ $# -gt 0 ] && [ "$1" != bash ]; do shift; done\n[ $# -gt 0 ] && exec "$@"\n'
        path = STUBS / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)


_install_stubs()


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Paths of every string value and mapping key (setup lines excluded: they are commands by design)."""
    out: list[tuple] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "setup":
                continue
            if prefix and prefix[-1] in ("env", "args", "extra"):  # free-form keys
                out.append(prefix + (("key", k),))
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, prefix + (i,))
    elif isinstance(obj, str) and prefix:
        out.append(prefix)
    return out


@st.composite
def mutated(draw: st.DrawFn) -> tuple[Path, str]:
    source, doc = draw(st.sampled_from(EXAMPLES))
    doc = copy.deepcopy(doc)
    if draw(st.booleans()):  # a new env entry carrying a payload
        layer = doc.setdefault("defaults", {}) if isinstance(doc.get("defaults", {}), dict) else {}
        if isinstance(layer.get("env", {}), dict):
            layer.setdefault("env", {})[draw(st.sampled_from(["EPD_X", "A_B"]))] = draw(st.sampled_from(PRINTABLE))
    for _ in range(draw(st.integers(1, 2))):
        path = draw(st.sampled_from(_paths(doc)))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        payload = draw(st.sampled_from(PAYLOADS if draw(st.booleans()) else PRINTABLE))
        last = path[-1]
        if isinstance(last, tuple):  # rename a key
            key = last[1]
            if key in parent:
                parent[payload if payload else "k"] = parent.pop(key)
            continue
        how = draw(st.sampled_from(["replace", "append", "prepend"]))
        old = str(parent[last])
        parent[last] = {"replace": payload, "append": old + payload, "prepend": payload + old}[how]
    try:
        text = yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)
    except yaml.YAMLError:
        text = yaml.safe_dump(doc, allow_unicode=False, sort_keys=False)
    return source, text


def _renders(source: Path, text: str) -> list[str]:
    """Validate and render; only epdctl's own errors may come out."""
    try:
        topo = topology_from_text(text, source)
    except TopologyError as exc:
        assert exc.problems and all(p.message for p in exc.problems)
        str(exc).encode("utf-8")  # the message prints: no lone surrogate in it
        return []
    try:
        plan = build_plan(topo)
        scripts = [to_shell(plan)]  # each node's part is a section of the whole plan: rendered, not run
        for node in plan.nodes:
            assert to_shell(plan, node)
        if topo.launcher == "slurm":
            scripts.append(render_sbatch(topo, plan))
    except EpdctlError as exc:
        str(exc).encode("utf-8")
        return []
    return scripts


def _execute(script: str, n: int) -> None:
    run = WORK / f"run{n % 4}"
    run.mkdir(exist_ok=True)
    target = run / "script.sh"
    script = LOCAL_BINS.sub(f"{STUBS}/", script)
    target.write_text(script, encoding="utf-8", errors="surrogateescape")
    env = {"PATH": f"{STUBS}:/usr/bin:/bin", "HOME": str(run), "STUB_LOG": str(run / "argv.log"),
           "EPD_RUN_DIR": str(run / "epd"), "SLURM_JOB_NODELIST": "n[0-63]", "SLURM_JOB_ID": "1",
           "EPD_READY_TIMEOUT": "2", "LANG": "C.UTF-8"}
    subprocess.run(["bash", str(target)], env=env, cwd=run, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=60)


STATS = {"examples": 0, "refused": 0, "rendered": 0, "executed": 0}


N_EXAMPLES = int(os.environ.get("EPD_FUZZ_EXAMPLES", "2000"))


@settings(max_examples=N_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(mutated())
def _one_mutated_topology(case: tuple[Path, str]) -> None:
    source, text = case
    STATS["examples"] += 1
    scripts = _renders(source, text)
    STATS["refused" if not scripts else "rendered"] += 1
    for script in scripts:
        if C in script or "EPD_CMD\ntouch" in script:  # a payload reached the script: run it
            STATS["executed"] += 1
            _execute(script, STATS["executed"])
    leaked = sorted(os.listdir(CANARY))
    assert not leaked, f"an injected command ran ({leaked}) for topology:\n{text}"


def test_no_traceback_and_no_injected_command() -> None:
    """N_EXAMPLES mutated topologies (printed with -s); the counts prove the executing path ran."""
    STATS.update(examples=0, refused=0, rendered=0, executed=0)
    _one_mutated_topology()
    print(f"fuzz: {STATS}")
    assert STATS["examples"] >= N_EXAMPLES
    assert STATS["executed"] > 0 and STATS["rendered"] > 0


def test_canary_stubs_would_catch_an_injection() -> None:
    """The harness itself: an unquoted payload in a script does create the canary."""
    _execute(f"echo x; touch {C}/control\n", 0)
    assert (CANARY / "control").exists()
    (CANARY / "control").unlink()
