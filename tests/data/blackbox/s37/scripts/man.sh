#!/bin/bash
# manual cell: man.sh NAME HP ; then the caller runs its steps in /work/bb4/NAME with $CFG ready and hook recorder up.
export PATH=/work/venv/bin:$PATH PYTHONPATH=/work/wt/blackbox4/agent
d=/work/bb4/$1; rm -rf $d; mkdir -p $d; cd $d
sed "s/18778/$2/" /work/bb4/cfg.yaml > cfg.yaml; printf "runner:\n  log_dir: $d/logs\n" >> cfg.yaml
