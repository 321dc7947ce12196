# sourced by every harness script: the code under test (after GO, /work/bb6/code.env holds CODE=<path>)
. /work/bb6/code.env
export PATH=${SHIM:+$SHIM:}/work/venv/bin:$PATH PYTHONPATH=$CODE/agent OMP_NUM_THREADS=1 B=/work/bb6 SLURM_CONF=/tmp/bb6-slurm/slurm.conf
