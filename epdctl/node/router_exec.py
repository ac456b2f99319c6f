"""``python -m epdctl.node.router_exec VAR MODULE FLAGS...``: run a router with its API key off argv.

smg and sglang-router take the key only as ``--api-key VALUE``, which every user of the node
could read with ``ps``. This wrapper reads VALUE from the environment variable VAR and runs
MODULE (``smg.launch_router``) in this process with the flag added to ``sys.argv`` only, so the
kernel's command line (``/proc/PID/cmdline``) shows the variable's name, never its value.
Standard library only: it runs on the router's node, where epdctl is installed.
"""

from __future__ import annotations

import os
import runpy
import sys


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: python -m epdctl.node.router_exec API_KEY_VAR ROUTER_MODULE [FLAGS...]")
    var, module, flags = argv[0], argv[1], argv[2:]
    key = os.environ.get(var)
    if not key:
        sys.exit(f"error: environment variable {var} (router API key) is empty or not set")
    sys.argv = [module, *flags, "--api-key", key]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
