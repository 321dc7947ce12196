#!/bin/bash
# Slurm epilog snippet (runs as root on every node of the job after it ends): remove the
# job's Prometheus file_sd file that train.sbatch / watch.sbatch write, even when the batch
# script was SIGKILLed and its EXIT trap never ran. The job's environment is not passed to
# an epilog, so the folder is set here; it must equal the jobs' RANKWATCH_SD_DIR.
#
#   slurm.conf:  Epilog=/etc/slurm/epilog.d/*     (Slurm >= 21.08 accepts a glob)
RANKWATCH_SD_DIR=${RANKWATCH_SD_DIR:-/shared/prometheus/file_sd/rankwatch}
case "${SLURM_JOB_ID:-}" in
  '' | *[!0-9]*) exit 0 ;;
esac
rm -f "$RANKWATCH_SD_DIR/slurm-$SLURM_JOB_ID.json" "$RANKWATCH_SD_DIR/slurm-$SLURM_JOB_ID-"*.json \
  "$RANKWATCH_SD_DIR/.slurm-$SLURM_JOB_ID".* "$RANKWATCH_SD_DIR/.slurm-$SLURM_JOB_ID-"*
exit 0
