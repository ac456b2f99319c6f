#!/usr/bin/env bash
# A real local SLURM cluster for tests and CI: munged + slurmctld + 4 slurmd ("fake nodes"
# node1..node4) on this one host, loopback mode (NodeAddr 127.0.0.1, slurmd ports 17001-17004,
# slurmctld 6817). Debian's slurm 22.05 runs several slurmd per host with `slurmd -N nodeX`.
# Each slurmd (and every job step it starts) runs in its own mount namespace, receiving the host's
# mounts but keeping its own: a test can give one node a disk of its own (tests/e2e/test_stage_slurm.py
# mounts a tmpfs there with nsenter), as each machine of a real cluster has its own local disk.
#
#   scripts/slurm_local.sh install   apt-get install the packages if missing (root)
#   scripts/slurm_local.sh up        install if missing, then start (idempotent; restarts on config change)
#   scripts/slurm_local.sh down      cancel jobs, stop the daemons and munged (exits 0 when already stopped)
#   scripts/slurm_local.sh status    sinfo
#   scripts/slurm_local.sh env       print `export SLURM_CONF=...` for clients
#
# Everything lives under $EPD_SLURM_DIR (default /tmp/epd-slurm). Clients need SLURM_CONF set
# (`eval "$(scripts/slurm_local.sh env)"`), else they fail with "fetch_config: DNS SRV lookup failed".
set -euo pipefail

D=${EPD_SLURM_DIR:-/tmp/epd-slurm}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CONF=$D/slurm.conf
NODES=${EPD_SLURM_NODES:-4}
CPUS=${EPD_SLURM_CPUS:-$(nproc)}
export SLURM_CONF=$CONF

log() { echo "slurm_local: $*" >&2; }

alive() {  # pidfile -> 0 when the process runs and is not a zombie (PID 1 here reaps late)
    local pid
    [ -s "$1" ] || return 1
    pid=$(cat "$1")
    kill -0 "$pid" 2>/dev/null || return 1
    [ "$(ps -o stat= -p "$pid" 2>/dev/null | cut -c1)" != "Z" ]
}

install_pkgs() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
        && command -v munged >/dev/null; then
        return 0
    fi
    [ "$(id -u)" = 0 ] || { log "slurm is not installed and this is not root; run: sudo $0 install"; exit 1; }
    local t0=$SECONDS
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 \
        slurmctld slurmd slurm-client munge >/dev/null
    log "installed slurmctld slurmd slurm-client munge in $((SECONDS - t0)) s"
}

write_conf() {  # -> stdout: the slurm.conf for $NODES nodes
    local last=$((17000 + NODES))
    cat <<EOF
# epdctl test cluster; slurmd: one mount namespace per node (unshare --mount --propagation slave)
ClusterName=epdtest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0
PlugStackConfig=$D/plugstack.conf
NodeName=node[1-$NODES] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[17001-$last] CPUs=$CPUS RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

start_munge() {
    mkdir -p /run/munge && chown munge:munge /run/munge && chmod 0755 /run/munge
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
        chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
    fi
    if ! alive /run/munge/munged.pid; then
        runuser -u munge -- /usr/sbin/munged
    fi
    munge -n | unmunge >/dev/null
}

running() {  # PIDS... -> prints those still running (not zombies); success when any is
    local p out=""
    for p in "$@"; do
        if kill -0 "$p" 2>/dev/null && [ "$(ps -o stat= -p "$p" 2>/dev/null | cut -c1)" != "Z" ]; then
            out="$out $p"
        fi
    done
    [ -n "$out" ] && echo $out
}

all_alive() {
    alive "$D/run/slurmctld.pid" || return 1
    for n in $(seq 1 "$NODES"); do alive "$D/run/slurmd-node$n.pid" || return 1; done
}

stop_daemons() {
    local pids="" f
    if alive "$D/run/slurmctld.pid"; then
        scancel --full --quiet --user=root 2>/dev/null || true
    fi
    for f in "$D"/run/slurmd-*.pid "$D/run/slurmctld.pid"; do
        if alive "$f"; then pids="$pids $(cat "$f")"; kill "$(cat "$f")" 2>/dev/null || true; fi
    done
    for _ in $(seq 1 100); do
        running $pids >/dev/null || break
        sleep 0.1
    done
    # slurmctld can ignore SIGTERM right after it started (seen 2 s after start): force it
    for p in $(running $pids); do
        kill -9 $(ps -o pid= --ppid "$p") "$p" 2>/dev/null || true
    done
    for _ in $(seq 1 50); do
        running $pids >/dev/null || break
        sleep 0.1
    done
    rm -f "$D"/run/*.pid
}

write_extras() {  # SPANK plugin stack and SLURM's OCI container support (oci.conf beside slurm.conf)
    local src=$ROOT/tests/spank/pyxis_options.c so=$D/spank_pyxis_options.so
    : >"$D/plugstack.conf"
    # a plugin registering pyxis's srun options (its own table), so real srun parses pyxis lines
    if [ -f /usr/include/slurm/spank.h ] && command -v gcc >/dev/null && [ -f "$src" ]; then
        if [ ! -f "$so" ] || [ "$src" -nt "$so" ]; then
            gcc -shared -fPIC -O2 -o "$so" -I "$ROOT/tests/fixtures/containers" "$src"
        fi
        echo "optional $so" >"$D/plugstack.conf"
    fi
    # SLURM's own containers (srun --container=BUNDLE; topologies/slurm-oci.yaml): slurmstepd
    # copies the bundle's config.json, puts the step's command, user, cwd and environment into its
    # process, and runs it with runc under $D/runc as container node.user.job.step.task
    # (%n.%u.%j.%s.%t; %b: the bundle). RunTimeRun (create+start in one) with Query/Kill/Delete,
    # as oci.conf(5) allows; `scancel` of the step kills and deletes the container.
    mkdir -p "$D/runc"
    cat >"$D/oci.conf" <<EOF
RunTimeQuery="runc --root=$D/runc state %n.%u.%j.%s.%t"
RunTimeKill="runc --root=$D/runc kill -a %n.%u.%j.%s.%t"
RunTimeDelete="runc --root=$D/runc delete --force %n.%u.%j.%s.%t"
RunTimeRun="runc --root=$D/runc run %n.%u.%j.%s.%t -b %b"
EOF
}

up() {
    install_pkgs
    mkdir -p "$D/state" "$D/run" "$D/log"
    write_extras
    for n in $(seq 1 "$NODES"); do mkdir -p "$D/spool/node$n"; done
    local new
    new=$(write_conf)
    if [ -f "$CONF" ] && [ "$new" = "$(cat "$CONF")" ] && all_alive; then
        return 0  # already up with this configuration
    fi
    stop_daemons
    printf '%s\n' "$new" >"$CONF"
    start_munge
    slurmctld -c -f "$CONF"
    for n in $(seq 1 "$NODES"); do unshare --mount --propagation slave slurmd -f "$CONF" -N "node$n"; done
    for _ in $(seq 1 300); do  # up to 30 s for every node to report idle
        if [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" = "$NODES" ]; then
            return 0
        fi
        sleep 0.1
    done
    log "nodes did not become idle within 30 s; see $D/log/"
    sinfo -N -l >&2 || true
    exit 1
}

case "${1:-up}" in
    install) install_pkgs ;;
    up) up ;;
    down)
        [ -f "$CONF" ] && stop_daemons
        if alive /run/munge/munged.pid; then kill "$(cat /run/munge/munged.pid)"; fi
        true ;;
    status) sinfo -N -l ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) log "usage: $0 {install|up|down|status|env}"; exit 2 ;;
esac
