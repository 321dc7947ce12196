#!/bin/bash
# Stops what slurm-single-node-up.sh started, by the PIDs it recorded: jobs first (so no
# slurmstepd outlives its slurmd), then slurmd, slurmctld and the private munged. Bounded.
D=${SLURM_TEST_DIR:-/tmp/rankwatch-slurm}
export SLURM_CONF=$D/slurm.conf

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

if [ -f "$SLURM_CONF" ] && [ -f "$D/slurmctld.bgpid" ] && alive "$(cat "$D/slurmctld.bgpid")"; then
  me=$(id -un)
  timeout 10 scancel --quiet --full --signal=KILL --user="$me" 2>/dev/null
  timeout 10 scancel --quiet --user="$me" 2>/dev/null
  for _ in $(seq 1 50); do
    [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
    sleep 0.2
  done
fi

pids=()
for f in slurmd.bgpid slurmctld.bgpid munge/munged.pid; do
  [ -f "$D/$f" ] || continue
  p=$(cat "$D/$f")
  alive "$p" && kill "$p" 2>/dev/null && pids+=("$p")
done
for _ in $(seq 1 50); do
  left=0
  for p in "${pids[@]}"; do alive "$p" && left=1; done
  [ "$left" = 0 ] && break
  sleep 0.1
done
for p in "${pids[@]}"; do alive "$p" && kill -9 "$p" 2>/dev/null; done
true
