#!/usr/bin/env bash
# Set up .venv (see scripts/setup.sh) plus what the tests drive for real (sshd, a local SLURM
# cluster, network namespaces, the engines' own parsers), then run the whole suite. CI runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
for pkg in openssh-server slurmctld slurmd slurm-client munge iproute2 libibverbs1 prometheus gcc libc6-dev; do
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
EPDCTL_SETUP_SGLANG=${EPDCTL_SETUP_SGLANG:-1} bash scripts/setup.sh
.venv/bin/python -m mypy   # every module's types, control plane and runtime (pyproject.toml [tool.mypy])
exec .venv/bin/python -m pytest -q "$@"
