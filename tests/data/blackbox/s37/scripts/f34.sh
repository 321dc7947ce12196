source /work/bb4/man.sh f34 18935
python /work/bb4/hook.py hook.jsonl 18935 & hp=$!
FAULT=crash FAULT_STEP=40 STEPS=60 torchrun --nproc-per-node 2 --master-port 29935 /work/bb4/t4.py > job.log 2>&1 & tr=$!
sleep 6; W=$(pgrep -P $tr | tr '\n' ' '); echo "workers: $W steps so far: $(grep -c step= job.log)"
args=(); for w in $W; do args+=(--pid $w); done
timeout -s INT 45 rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps "${args[@]}" > out.txt 2> err.txt; echo "agent rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee rc.txt
wait $tr; echo "job rc=$?"
sleep 2; kill $hp; python /work/bb4/show.py .
for p in /proc/[0-9]*; do c=$(readlink $p/cwd 2>/dev/null); case "$c" in /work/bb4/f34*) echo "LEFT ${p#/proc/} $(tr '\0' ' ' < $p/cmdline | cut -c1-100)";; esac; done
