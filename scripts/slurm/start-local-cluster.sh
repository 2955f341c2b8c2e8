#!/usr/bin/env bash
# Starts a single-node Slurm cluster on this machine (munged, slurmctld, slurmd, all on 127.0.0.1)
# for tests/slurm.rs; .ci/run runs it. Run as root, with Debian's `slurm-wlm` and `munge` installed.
# No systemd needed: the daemons are started directly and detach themselves (they do in a container).
#
#   scripts/slurm/start-local-cluster.sh          # configure and start; again: nothing to do
#   scripts/slurm/start-local-cluster.sh --stop   # stop the daemons it started (by their pid files)
#
# It writes ${SLURM_CONF:-/etc/slurm/slurm.conf} with the node's real CPU layout and memory (as
# `slurmd -C` measures them) and a first line that marks the file as its own. It refuses to touch a
# slurm.conf without that line: this machine is then part of a real cluster. Running it again keeps
# running daemons, restarting them only when the configuration it would write has changed. Jobs run
# as the user who submits them; slurmd runs as root, so root's jobs run as root.
set -euo pipefail

conf="${SLURM_CONF:-/etc/slurm/slurm.conf}"
marker="# Written by layerwise scripts/slurm/start-local-cluster.sh: a single-node test cluster."
ctld_pid=/run/slurmctld.pid
slurmd_pid=/run/slurmd.pid
munged_pid=/run/munge/munged.pid

die() { echo "start-local-cluster: $*" >&2; exit 1; }
# A pid file whose process is alive and is the named program.
running() { [ -s "$1" ] && [ "$(cat "/proc/$(cat "$1")/comm" 2>/dev/null)" = "$2" ]; }
stop() {
    if running "$1" "$2"; then
        local pid
        pid="$(cat "$1")"
        kill "$pid"
        for _ in $(seq 50); do [ -e "/proc/$pid" ] || break; sleep 0.2; done
        [ ! -e "/proc/$pid" ] || die "$2 (pid $pid) did not stop"
        echo "stopped $2 (pid $pid)"
    fi
}

[ "$(id -u)" = 0 ] || die "run as root (it writes $conf and starts daemons)"
if [ -e "$conf" ] && [ "$(head -n 1 "$conf")" != "$marker" ]; then
    die "$conf was not written by this script (its first line is not its marker): not touching a real cluster"
fi
if [ "${1:-}" = "--stop" ]; then
    stop "$slurmd_pid" slurmd
    stop "$ctld_pid" slurmctld
    stop "$munged_pid" munged
    exit 0
fi
[ $# = 0 ] || die "usage: $0 [--stop]"
for tool in munged mungekey slurmctld slurmd sinfo scontrol runuser; do
    command -v "$tool" >/dev/null 2>&1 ||
        die "$tool not found: install Debian's packages with 'apt-get install slurm-wlm munge'"
done

# munge: the shared key (Debian's package creates one; make it when missing) and the daemon, which
# runs as the munge user.
if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
if ! running "$munged_pid" munged; then
    runuser -u munge -- munged
    echo "started munged"
fi
munge -n | unmunge >/dev/null || die "munge does not work: see /var/log/munge/munged.log"

# slurm.conf. The node is this host's short name at 127.0.0.1; `slurmd -C` prints its hardware line.
host="$(hostname -s)"
hardware="$(slurmd -C | head -n 1)"
case "$hardware" in
    NodeName=*" CPUs="*" RealMemory="*) ;;
    *) die "unexpected output of 'slurmd -C': $hardware" ;;
esac
hardware="${hardware#NodeName=* }"
install -d -o slurm -g slurm -m 0755 /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm
new_conf="$(mktemp)"
trap 'rm -f "$new_conf"' EXIT
cat >"$new_conf" <<EOF
$marker
ClusterName=layerwise-local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=$ctld_pid
SlurmdPidFile=$slurmd_pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
# No cgroups (a container may not delegate them) and no accounting database.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
# Cores are allocated; memory is not (a job without --mem would otherwise take the whole node).
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# A node that was down comes back when its slurmd registers; finished jobs stay visible to
# 'scontrol show job' for an hour (tests read their states and exit codes there).
ReturnToService=2
MinJobAge=3600
NodeName=$host NodeAddr=127.0.0.1 $hardware State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
if ! cmp -s "$new_conf" "$conf"; then
    if running "$ctld_pid" slurmctld || running "$slurmd_pid" slurmd; then
        echo "the configuration changed: restarting the Slurm daemons"
        stop "$slurmd_pid" slurmd
        stop "$ctld_pid" slurmctld
    fi
    install -D -m 0644 "$new_conf" "$conf"
    echo "wrote $conf"
fi

if ! running "$ctld_pid" slurmctld; then
    slurmctld
    echo "started slurmctld"
fi
if ! running "$slurmd_pid" slurmd; then
    slurmd
    echo "started slurmd"
fi

# Ready when the node is idle (or already running jobs).
state=""
for _ in $(seq 60); do
    state="$(sinfo -h -n "$host" -o %T 2>/dev/null || true)"
    case "$state" in
        idle | mixed | allocated | completing) break ;;
        down* | drain*) scontrol update NodeName="$host" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 1
done
case "$state" in
    idle | mixed | allocated | completing) ;;
    *) die "node $host is '${state:-not reported}' after 60 s: see /var/log/slurm/slurmctld.log and slurmd.log" ;;
esac
sinfo
