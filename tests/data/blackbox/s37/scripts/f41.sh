source /work/bb4/man.sh f41 18944
python /work/bb4/hook.py hook.jsonl 18944 & hp=$!
FAULT=nan FAULT_STEP=40 STEPS=60 torchrun --nproc-per-node 2 --master-port 29944 /work/bb4/t4.py > job.log 2>&1 & tr=$!
sleep 8; echo "lines before attach: $(grep -c step= job.log)"
timeout -s INT 30 rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 't4\.py' > out.txt 2> err.txt; echo "agent rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee rc.txt
wait $tr; echo "job rc=$?"
sleep 2; kill $hp; python /work/bb4/show.py .
for p in /proc/[0-9]*; do c=$(readlink $p/cwd 2>/dev/null); case "$c" in /work/bb4/f41*) echo "LEFT ${p#/proc/} $(tr '\0' ' ' < $p/cmdline | cut -c1-100)";; esac; done
