# sourced by every harness script: the code under test (after GO, /work/bb7/code.env holds CODE=<path>)
. /work/bb7/code.env
export PATH=${SHIM:+$SHIM:}/work/venv/bin:$PATH PYTHONPATH=$CODE/agent OMP_NUM_THREADS=1 B=/work/bb7 SLURM_CONF=/tmp/bb7-slurm/slurm.conf
