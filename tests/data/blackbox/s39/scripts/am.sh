#!/bin/bash
# am.sh NAME HP AMPORT MPORT: real Alertmanager 0.25 on loopback (its webhook receiver = the recorder) as rankwatch's only sink;
# `run -- torchrun --tee 3 --rdzv-id job<NAME>`, rank 1 RuntimeError at step 10
source /work/bb6/man.sh $1 $2
cat > am.yml <<EOA
route: {receiver: hook, group_by: [alertname, run], group_wait: 1s, group_interval: 2s, repeat_interval: 1h}
receivers: [{name: hook, webhook_configs: [{url: "http://127.0.0.1:$2/hook"}]}]
EOA
prometheus-alertmanager --config.file=am.yml --storage.path=amdata --web.listen-address=127.0.0.1:$3 --cluster.listen-address= > am.log 2>&1 & am=$!
for i in $(seq 1 50); do curl -sf http://127.0.0.1:$3/-/ready >/dev/null && break; sleep 0.1; done
printf 'alerts:\n  startup_quiet: 0s\n  group_wait: 2s\n  alertmanager: {urls: ["http://127.0.0.1:%s"]}\nstall: {startup_grace: 40s, floor: 10s, silent_rank_timeout: 20s}\nrunner: {log_dir: %s/logs}\n' $3 $PWD > cfg.yaml
FAULT=crash FAULT_STEP=10 STEPS=40 timeout --preserve-status -s INT 60 rankwatch run -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps \
  -- torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:$4 --rdzv-id job$1 --tee 3 /work/bb6/t6.py > out.txt 2> err.txt; rc=$?
sleep 4
curl -s http://127.0.0.1:$3/api/v2/alerts > am_alerts.json
python3 -c "
import json; a=json.load(open('am_alerts.json')); print('AM alerts:', len(a))
for x in a: print(x['status']['state'], x['labels'], {k: v[:200] for k, v in x['annotations'].items()})"
kill $am; wait $am 2>/dev/null
echo "rc=$rc load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
