#!/bin/bash
# usage: cell.sh NAME TIMEOUT -- rankwatch-args...   (env passes through)
# runs rankwatch with per-cell findings/dumps/logs, collects rc, hook payloads, leftovers
export PATH=/work/venv/bin:$PATH
name=$1; to=$2; shift 3
d=/work/bb2/$name; rm -rf $d; mkdir -p $d; cd $d
: > /work/bb2/hook.jsonl
start=$(date +%s)
timeout -s INT $to rankwatch "$@" >$d/out.txt 2>$d/err.txt; rc=$?
echo "rc=$rc elapsed=$(( $(date +%s)-start ))s" | tee $d/rc.txt
sleep 3
cp /work/bb2/hook.jsonl $d/hook.jsonl
echo "--- findings"; [ -f $d/f.jsonl ] && python -c "
import json,sys
for l in open('$d/f.jsonl'):
    f=json.loads(l); print({k:f.get(k) for k in ('kind','rank','step','severity','run','message') if k in f} if isinstance(f,dict) else f)
" | cut -c1-400
echo "--- hook"; python -c "
import json
for l in open('$d/hook.jsonl'):
    try: p=json.loads(l)
    except Exception: print('RAW',l[:300]); continue
    al = p.get('alerts', [p]) if isinstance(p,dict) else p
    for a in (al if isinstance(al,list) else [al]):
        print({k:a.get(k) for k in ('status','title','kind','rank','run','suspect','first_failure','severity') if k in a})
" | cut -c1-500
echo "--- leftovers"; ps -eo pid,ppid,user,etimes,args | grep -E '/work/bb2|cfg.yaml|torchrun --nproc|hook.py' | grep -v -E 'grep|cell.sh' | grep -v "$$"
