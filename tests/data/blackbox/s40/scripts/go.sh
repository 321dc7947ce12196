#!/bin/bash
# go.sh: polls /work/bb7/GO every 30 s; on it: CODE= and SHA= into code.env, checks the import, starts runall.sh (through dfl.py)
cd /work/bb7
while [ ! -s GO ]; do
  if [ "$(date -u +%H%M)" -ge 0115 ] && [ "$(date -u +%H)" = 01 ]; then echo "NO GO by 01:15 $(date -u +%T)" >> golog.txt; echo "CODE=/work/main" > GO.fallback; cp GO.fallback GO.use; break; fi
  sleep 30
done
[ -s GO ] && cp GO GO.use
CODE=$(grep -o 'CODE=[^ ]*' GO.use | head -1 | cut -d= -f2); SHA=$(grep -o 'SHA=[^ ]*' GO.use | head -1 | cut -d= -f2)
echo "GO read $(date -u +%T): CODE=$CODE SHA=$SHA" >> golog.txt; cat GO.use >> golog.txt
echo "CODE=$CODE" > code.env
. ./env.sh
python -c 'import rankwatch;print(rankwatch.__file__)' >> golog.txt 2>&1
[ -z "$SHA" ] && git -C $CODE rev-parse HEAD >> golog.txt 2>&1
case "$(python -c 'import rankwatch;print(rankwatch.__file__)')" in $CODE/*) echo "import OK" >> golog.txt;; *) echo "IMPORT NOT FROM CODE" >> golog.txt; exit 1;; esac
exec python3 /work/bb7/dfl.py ./runall.sh
