#!/bin/bash
# A one-node Slurm cluster on loopback for tests (Debian slurm-wlm 22.05 + munge, run as root).
# Needs: apt-get install -y slurm-wlm munge. Prints the SLURM_CONF export to use. Ready in about 1 s.
#
# Everything lives in SLURM_TEST_DIR (default /tmp/rankwatch-slurm), munged included: a private
# munged with its own key and socket (AuthInfo=socket=...), so two clusters on one machine, or
# a system munged, never interfere. SLURM_TEST_CTLD_PORT / SLURM_TEST_SLURMD_PORT choose the
# ports (default 16817 / 16818). slurm-single-node-down.sh stops what this started.
set -euo pipefail
D=${SLURM_TEST_DIR:-/tmp/rankwatch-slurm}
CTLD_PORT=${SLURM_TEST_CTLD_PORT:-16817}
SLURMD_PORT=${SLURM_TEST_SLURMD_PORT:-16818}
H=$(hostname -s)
if [ -z "$D" ] || [ "$D" = / ]; then
  echo "bad SLURM_TEST_DIR" >&2
  exit 2
fi
rm -rf "${D:?}"/{state,spool,munge}
mkdir -p "$D"/{state,spool,munge}
chmod 0755 "$D"
chmod 0700 "$D/munge"

M=$D/munge
if command -v mungekey >/dev/null; then
  mungekey --create --keyfile="$M/munge.key" --force
else
  dd if=/dev/urandom of="$M/munge.key" bs=1024 count=1 2>/dev/null
fi
chmod 0400 "$M/munge.key"
munged --force --socket="$M/munge.sock" --key-file="$M/munge.key" --log-file="$M/munged.log" \
  --pid-file="$M/munged.pid" --seed-file="$M/munged.seed"
for _ in $(seq 1 100); do
  munge -S "$M/munge.sock" -n </dev/null 2>/dev/null | unmunge -S "$M/munge.sock" >/dev/null 2>&1 && break
  sleep 0.05
done

cat >"$D/slurm.conf" <<CONF
ClusterName=ci
SlurmctldHost=$H
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
AuthInfo=socket=$M/munge.sock
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
MinJobAge=${SLURM_TEST_MIN_JOB_AGE:-10}
KillWait=${SLURM_TEST_KILL_WAIT:-5}
NodeName=$H NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=$H Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$D/slurm.conf"
slurmctld -D -c >"$D/slurmctld.out" 2>&1 &
echo $! >"$D/slurmctld.bgpid"
slurmd -D >"$D/slurmd.out" 2>&1 &
echo $! >"$D/slurmd.bgpid"
for _ in $(seq 1 150); do
  sinfo -h -o %T 2>/dev/null | grep -q '^idle' && break
  sleep 0.2
done
sinfo -h -o %T | grep -q '^idle' || {
  echo "slurm did not come up" >&2
  tail -n 20 "$D"/*.log "$D"/*.out >&2
  exit 1
}
echo "export SLURM_CONF=$D/slurm.conf"
