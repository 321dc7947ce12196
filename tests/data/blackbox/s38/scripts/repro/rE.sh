# E (g15): one sidecar per rank (watch --match ... --log ...): world_size and user null, title "2 ranks (0-1)"
for r in 0 1; do rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match "t5.py tag=r$r" --log rank-$r.log > agent-$r.txt 2>&1 & eval A$r=\$!; done; sleep 4
for r in 0 1; do RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29906 FAULT=nan FAULT_STEP=15 STEPS=30 python $S/t5.py tag=r$r > rank-$r.log 2>&1 & eval P$r=\$!; done
wait $P0 $P1; sleep 6; kill -TERM $A0 $A1; wait $A0 $A1; python $S/show.py . | cut -c1-200
