source /work/bb4/man.sh f20 18920
python /work/bb4/hook.py hook.jsonl 18920 & hp=$!
FAULT=crash FAULT_STEP=40 STEPS=60 torchrun --nproc-per-node 2 --master-port 29920 --tee 3 /work/bb4/t4.py > job.log 2>&1 & tr=$!
sleep 6; echo "steps seen before attach: $(grep -c step= job.log)"
timeout -s INT 50 rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --pid $tr > out.txt 2> err.txt; echo "agent rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee rc.txt
wait $tr; echo "job rc=$?"
sleep 2; kill $hp; python /work/bb4/show.py .
for p in /proc/[0-9]*; do c=$(readlink $p/cwd 2>/dev/null); case "$c" in /work/bb4/f20*) echo "LEFT ${p#/proc/} $(tr '\0' ' ' < $p/cmdline | cut -c1-100)";; esac; done
