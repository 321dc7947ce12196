# B (g11b): node daemon, torchrun --redirects --max-restarts 1: attempt 0 crashes, attempt 1 goes NaN -> the NaN is never reported
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 't5\.py' > agent.txt 2>&1 & A=$!; sleep 3
FAULT=crash ONLY_ATTEMPT=0 FAULT_A1=nan FAULT_STEP=10 STEPS=25 torchrun --nproc-per-node 2 --master-port 29902 --max-restarts 1 --redirects 3 --log-dir tl $S/t5.py > job.log 2>&1
sleep 8; kill -TERM $A; wait $A; grep -c 'loss=nan' tl/*/attempt_1/1/stdout.log; echo "nan_loss findings: $(grep -c nan_loss f.jsonl)"
