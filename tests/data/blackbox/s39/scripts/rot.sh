#!/bin/bash
# rot.sh NAME HP MPORT: two hand-launched ranks logging through logging.handlers.RotatingFileHandler (maxBytes 800, ~12 lines
# per file, backupCount 5) to train-rank{0,1}.log; `watch --log train-rank0.log --log train-rank1.log`; FAULT etc. from env
source /work/bb6/man.sh $1 $2
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --log train-rank0.log --log train-rank1.log > out.txt 2> err.txt & ag=$!
sleep 2
for r in 0 1; do RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$3 LOGFMT=rotate LOGFILE=train-rank$r.log MAXBYTES=800 STEPS=60 \
  python /work/bb6/t6.py > stdout-$r.txt 2>&1 & eval p$r=\$!; done
wait $p0; r0=$?; wait $p1; r1=$?; echo "ranks rc=$r0,$r1 $(date -u +%T)"; ls train-rank*
sleep 15; kill -INT $ag; wait $ag; echo "watch rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
