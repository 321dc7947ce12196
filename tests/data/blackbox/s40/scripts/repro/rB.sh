# l07: `run -- timeout -s TERM 15 torchrun --tee 3`, a healthy job ended by the user's own time limit -> a critical rank-less
# "crash" alert ("process exited with code 124 ... SignalException ... got signal: 15"). ~25 s
. tests/data/blackbox/s40/scripts/repro/setup.sh
STEPS=300 $RW timeout -s TERM 15 torchrun --nproc-per-node 2 --master-port 29472 --tee 3 $S/t7.py > out.txt 2> err.txt; echo "rc=$? (124 expected)"; sleep 3
python $S/show.py .; kill $HP
