#!/bin/bash
. /work/bb5/env.sh; d=/work/bb5/g38; rm -rf $d; mkdir -p $d; cd $d
i=$(ls -d /work/bb5/g01/dumps/*/*_stall* | head -1); echo "incident $i"
{ rankwatch report $i -o r.html; echo "rc=$?"; rankwatch report $i --format markdown; echo "rc=$?"
  echo "script tags: $(grep -ci '<script' r.html)  remote src/href: $(grep -Eoi '(src|href)="https?:[^"]*' r.html | head -3 | tr '\n' ' ')"
  python - <<'P'
import re,html
t=open('r.html').read(); x=re.sub(r'<[^>]+>',' ',t); x=html.unescape(re.sub(r'\s+',' ',x))
i=x.lower().find('suspect'); print('TEXT around suspect:', x[max(0,i-200):i+300])
P
} > out.txt 2>&1; cat out.txt
