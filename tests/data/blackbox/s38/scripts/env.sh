# sourced by every harness script: the code under test (phase 2 writes /work/bb5/code.env: CODE=<path>)
. /work/bb5/code.env
export PATH=${SHIM:+$SHIM:}/work/venv/bin:$PATH PYTHONPATH=$CODE/agent OMP_NUM_THREADS=1 B=/work/bb5
