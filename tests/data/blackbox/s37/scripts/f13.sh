source /work/bb4/man.sh f13 18913
python /work/bb4/hook.py hook.jsonl 18913 & hp=$!
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --log metrics-rank0.jsonl --log metrics-rank1.jsonl > out.txt 2> err.txt & ag=$!
sleep 2
FAULT=nan LOGFMT=jsonfile FAULT_STEP=15 STEPS=60 torchrun --nproc-per-node 2 --master-port 29913 /work/bb4/t4.py > job.log 2>&1; echo "job rc=$?"
sleep 6; kill -INT $ag; wait $ag; echo "agent rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee rc.txt
sleep 2; kill $hp; python /work/bb4/show.py .
