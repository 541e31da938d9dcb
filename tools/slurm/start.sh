#!/usr/bin/env bash
# A real single-node Slurm on this machine, for the tests (and a developer): munged, slurmctld and
# slurmd from Debian's packages (slurmctld slurmd slurm-client munge), SlurmUser=root, proctrack/
# linuxproc, task/none, accounting off (sacct then fails, as on many clusters). Idempotent: a
# controller already answering is left alone. Needs root. Starts in a few seconds.
#   sudo tools/slurm/start.sh            # install the packages first: apt-get install slurmctld slurmd slurm-client munge
#   sudo tools/slurm/start.sh --stop     # stop the daemons
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "tools/slurm/start.sh: run as root (it writes /etc/slurm and starts daemons)" >&2; exit 1; }
for bin in munged slurmctld slurmd sbatch; do
    command -v "$bin" > /dev/null || { echo "tools/slurm/start.sh: $bin missing: apt-get install slurmctld slurmd slurm-client munge" >&2; exit 1; }
done
if [ "${1:-}" = "--stop" ]; then
    pkill -x slurmd || true; pkill -x slurmctld || true
    exit 0
fi
host=$(hostname -s)
cpus=16  # more than the machine has (config_overrides): several test jobs of 1 CPU run at once
conf=/etc/slurm/slurm.conf
want=$(cat <<CONF
# written by stepwatch's tools/slurm/start.sh: a single-node test cluster
ClusterName=stepwatch
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# ended jobs stay in the controller's memory for scontrol show job (no accounting to ask)
MinJobAge=600
KillWait=5
InactiveLimit=0
MessageTimeout=10
NodeName=$host CPUs=$cpus RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
if [ ! -f "$conf" ] || [ "$(cat "$conf")" != "$want" ]; then
    printf '%s\n' "$want" > "$conf"
    pkill -x slurmd || true; pkill -x slurmctld || true
fi
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2> /dev/null
fi
chown munge:munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge 2> /dev/null || true
chmod 400 /etc/munge/munge.key
if ! pgrep -x munged > /dev/null; then
    runuser -u munge -- /usr/sbin/munged --force 2> /dev/null || /usr/sbin/munged --force
fi
pgrep -x slurmctld > /dev/null || slurmctld
pgrep -x slurmd > /dev/null || slurmd
for _ in $(seq 1 100); do
    if sinfo -h -o '%T' 2> /dev/null | grep -qE '^(idle|mixed|allocated)'; then
        echo "slurm: $(sinfo -h -o '%P %D %T %C') on $host"
        exit 0
    fi
    scontrol update NodeName="$host" State=RESUME > /dev/null 2>&1 || true
    sleep 0.2
done
echo "tools/slurm/start.sh: the node did not come up idle; see /var/log/slurm/slurmctld.log and slurmd.log" >&2
sinfo >&2 || true
exit 1
