#!/bin/bash
# A one-node Slurm cluster on loopback for tests (Debian slurm-wlm 22.05 + munge, run as root).
# Needs: apt-get install -y slurm-wlm munge. Prints the SLURM_CONF export to use. Ready in about 1 s.
set -euo pipefail
D=${SLURM_TEST_DIR:-/tmp/rankwatch-slurm}; H=$(hostname -s)
rm -rf "$D"; mkdir -p "$D"/{state,spool}
cat > "$D/slurm.conf" <<CONF
ClusterName=ci
SlurmctldHost=$H
SlurmUser=root
SlurmdUser=root
SlurmctldPort=${CTLD_PORT:-29490}
SlurmdPort=${SLURMD_PORT:-29491}
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
InactiveLimit=0
MinJobAge=10
KillWait=5
NodeName=$H NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=$H Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$D/slurm.conf"
# munge: key is created by the Debian package; create one if missing
[ -s /etc/munge/munge.key ] || { mungekey -c -f -k /etc/munge/munge.key 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
mkdir -p /run/munge && chown munge:munge /run/munge
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
until munge -n </dev/null | unmunge >/dev/null 2>&1; do sleep 0.05; done
slurmctld -D -c >"$D/slurmctld.out" 2>&1 & echo $! > "$D/slurmctld.bgpid"
slurmd -D >"$D/slurmd.out" 2>&1 & echo $! > "$D/slurmd.bgpid"
for _ in $(seq 1 150); do sinfo -h -o %T 2>/dev/null | grep -q '^idle' && break; sleep 0.2; done
sinfo -h -o %T | grep -q '^idle' || { echo "slurm did not come up"; tail -20 "$D"/*.log; exit 1; }
echo "export SLURM_CONF=$D/slurm.conf"
