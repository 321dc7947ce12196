#!/bin/bash
. /work/bb5/env.sh; d=/work/bb5/g55; rm -rf $d; mkdir -p $d; cd $d
i=$(ls -d /work/bb5/g05/dumps/*/*_stall* | head -1)
{ rankwatch report $i --format markdown; echo "rc=$?"; rankwatch report $i -o r.html; echo "rc=$?"
  python - <<'P'
import re,html
t=open('r.html').read(); x=html.unescape(re.sub(r'\s+',' ',re.sub(r'<[^>]+>',' ',re.sub(r'<style.*?</style>','',t,flags=re.S))))
for w in ('suspect','rank 1','stopped','no stack','not recorded'):
    i=x.find(w); print(w, '->', x[max(0,i-100):i+200] if i>=0 else 'ABSENT')
P
} > out.txt 2>&1; cat out.txt
