# F (g35, g36): analyze on the real logs kept in repro/
R=$S/../repro
rankwatch analyze --json $R/g35/g09-run.log | python -c "import json,sys; d=json.load(sys.stdin); print(sorted({f['kind'] for f in d['findings']}))"
(cd $R/g36 && rankwatch analyze --json tl/*/attempt_*/*/*.log) | python -c "import json,sys; d=json.load(sys.stdin); [print(f['kind'], f['rank'], f['step'], f['message'][:80]) for f in d['findings']]"
