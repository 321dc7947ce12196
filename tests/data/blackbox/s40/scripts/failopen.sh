#!/bin/bash
# failopen.sh NAME LPORT: `watch --fail-open -c bad1.yaml --listen 127.0.0.1:LPORT --match 'no-such-trainer'`; after 6 s: /healthz, /readyz, /metrics; SIGINT
set -m   # job control: the background agent keeps SIGINT
. /work/bb7/env.sh
d=/work/bb7/$1; rm -rf $d; mkdir -p $d; cd $d
printf 'alerts:\n  startup_quiet: 0s\n  webhook:\n    urlz: ["http://127.0.0.1:19299/hook"]\n' > bad1.yaml
rankwatch watch --fail-open -c bad1.yaml --listen 127.0.0.1:$2 --match 'no-such-trainer' > out.txt 2> err.txt & ag=$!
sleep 6; echo "alive after 6 s: $(kill -0 $ag 2>/dev/null && echo yes || echo no)"
for u in healthz readyz; do echo "/$u -> $(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$2/$u)"; done
curl -s http://127.0.0.1:$2/metrics | grep -i "degraded" | head -5
kill -INT $ag; wait $ag; echo "rc=$? at=$(date -u +%T)" | tee rc.txt
echo "--- stderr"; head -c 1500 err.txt; echo "--- stdout"; head -c 600 out.txt
