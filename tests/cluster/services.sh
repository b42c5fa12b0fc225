#!/usr/bin/env bash
# Install, start and stop a single-host SLURM cluster (munge, slurmctld, slurmd) and
# Open MPI for the cluster tests. Every command is idempotent.
#
#   services.sh install   apt-get the Debian packages (root; skipped when present)
#   services.sh start     write slurm.conf, start the daemons, wait until the node is idle
#   services.sh stop      stop the daemons this script started, by their process ids
#   services.sh env       print the variables a client needs (SLURM_CONF=...)
#
# State (configuration, spool, logs, pid files) lives in $INTERLOCK_SLURM_DIR
# (default: /tmp/interlock-slurm). Ports: $INTERLOCK_SLURM_PORT (slurmctld, default 6817)
# and the next one (slurmd).
set -euo pipefail

STATE="${INTERLOCK_SLURM_DIR:-/tmp/interlock-slurm}"
CTLD_PORT="${INTERLOCK_SLURM_PORT:-6817}"
SLURMD_PORT=$((CTLD_PORT + 1))
PACKAGES=(slurm-wlm munge openmpi-bin)
WAIT_SECONDS="${INTERLOCK_SLURM_WAIT:-60}"

log() { echo "services.sh: $*" >&2; }

install() {
    local missing=()
    for command in slurmctld slurmd munged srun mpirun; do
        command -v "$command" >/dev/null 2>&1 || missing+=("$command")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        log "already installed: ${PACKAGES[*]}"
        return 0
    fi
    if [ "$(id -u)" -ne 0 ]; then
        log "missing ${missing[*]}; installing ${PACKAGES[*]} needs root"
        return 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
    log "installed ${PACKAGES[*]}"
}

# A process id from a pid file, when that process is alive.
live_pid() {
    local file="$1" pid
    [ -s "$file" ] || return 1
    pid="$(cat "$file")"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    if munge_works; then
        log "munged already answers"
        return 0
    fi
    if [ ! -s /etc/munge/munge.key ]; then
        if command -v mungekey >/dev/null 2>&1; then
            mungekey --create --force
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        fi
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    chmod 755 /run/munge
    # as the munge user, the way the packaged service runs it
    runuser -u munge -- munged --pid-file=/run/munge/munged.pid
    local deadline=$((SECONDS + 15))
    until munge_works; do
        [ $SECONDS -lt $deadline ] || { log "munged does not answer"; return 1; }
        sleep 0.2
    done
    cp /run/munge/munged.pid "$STATE/munged.pid"  # started here: stopped here
}

write_config() {
    local node cpus
    node="$(hostname -s)"
    cpus="$(nproc)"
    mkdir -p "$STATE/spool/ctld" "$STATE/spool/d" "$STATE/log"
    cat >"$STATE/slurm.conf" <<EOF
# single-host cluster for interlock's cluster tests (written by services.sh)
ClusterName=interlock
SlurmctldHost=$node
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a job step's credential lives 20 s (default 120): long enough to launch a step on a
# loaded host, and SLURM holds a requeued job for this long before it starts again
AuthInfo=cred_expire=20
CredType=cred/munge
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
# no cgroups in a container: plain process tracking, no task binding or accounting
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
# a few seconds between SIGTERM and SIGKILL when a job is cancelled
KillWait=10
InactiveLimit=0
MinJobAge=30
SlurmdTimeout=30
# tasks may outnumber the CPUs (several ranks per CPU in the tests)
NodeName=$node CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
    rm -f "$STATE/cgroup.conf"
}

node_idle() {
    sinfo --noheader --Node --format '%T' 2>/dev/null | grep -qx 'idle'
}

start() {
    mkdir -p "$STATE"
    export SLURM_CONF="$STATE/slurm.conf"
    start_munge
    if live_pid "$STATE/slurmctld.pid" >/dev/null && live_pid "$STATE/slurmd.pid" >/dev/null \
            && node_idle; then
        log "slurm already running ($STATE)"
        return 0
    fi
    write_config
    live_pid "$STATE/slurmctld.pid" >/dev/null || slurmctld -i
    live_pid "$STATE/slurmd.pid" >/dev/null || slurmd
    local deadline=$((SECONDS + WAIT_SECONDS))
    until node_idle; do
        if [ $SECONDS -ge $deadline ]; then
            log "the node did not become idle within ${WAIT_SECONDS}s:"
            sinfo --Node --long >&2 || true
            tail -n 20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
            return 1
        fi
        # a node that registered DOWN (e.g. after an unclean stop) is brought back
        scontrol update NodeName="$(hostname -s)" State=RESUME >/dev/null 2>&1 || true
        sleep 0.5
    done
    log "slurm is up: $(sinfo --noheader --Node --format '%N %T %c')"
}

stop_pid_file() {
    local file="$1" name="$2" pid
    if pid="$(live_pid "$file")"; then
        kill -TERM "$pid"
        local deadline=$((SECONDS + 15))
        while kill -0 "$pid" 2>/dev/null; do
            if [ $SECONDS -ge $deadline ]; then
                kill -KILL "$pid" 2>/dev/null || true
                break
            fi
            sleep 0.2
        done
        log "stopped $name (pid $pid)"
    fi
    rm -f "$file"
}

stop() {
    stop_pid_file "$STATE/slurmd.pid" slurmd
    stop_pid_file "$STATE/slurmctld.pid" slurmctld
    stop_pid_file "$STATE/munged.pid" munged
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    env) echo "SLURM_CONF=$STATE/slurm.conf" ;;
    *) echo "usage: $0 install|start|stop|env" >&2; exit 2 ;;
esac
