#!/bin/bash
# v.sh CELL: the console (lines cut), the firing alert ids, err.txt tail
c=$1; cut -c1-${W:-400} console/$c.txt | grep -v '^\[default[0-9]\]:step=\|^step=' | tail -${N:-40}
[ -f $c/hook.jsonl ] && python3 - $c/hook.jsonl <<'PY'
import json,sys
ids={}
for l in open(sys.argv[1]):
    try: q=json.loads(l)
    except Exception: continue
    for a in (q.get("alerts",[q]) if isinstance(q,dict) else q):
        ids.setdefault((a.get("status"),a.get("id")),0); ids[(a.get("status"),a.get("id"))]+=1
print("POSTs by (status,id):", ids)
PY
echo "--- err.txt tail"; [ -f $c/err.txt ] && grep -v "step=" $c/err.txt | tail -${E:-8} | cut -c1-300
