source /work/bb4/man.sh f23 18923
python /work/bb4/hook.py hook.jsonl 18923 & hp=$!
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --log rank-1.log > out.txt 2> err.txt & ag=$!
sleep 2
DEL_STEP=10 NAN_STEP=20 STEPS=30 STEP_DELAY=0.5 python /work/bb4/relog.py rank-1.log; echo "writer rc=$?"
sleep 6; kill -INT $ag; wait $ag; echo "agent rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee rc.txt
sleep 2; kill $hp; python /work/bb4/show.py .
