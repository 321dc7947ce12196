# l49: `rankwatch analyze --json` on the real torchrun --redirects 3 tree of l16 (tqdm bar on stderr with update(1) then
# set_postfix(loss=...), coloured step lines on stdout; NaN on rank 1 from step 15) -> besides the right NaNs, a WARNING
# loss_divergence on healthy rank 0 built from the bar's lagged postfix (74 "steps" for 30). ~3 s
export PATH=/work/venv/bin:$PATH PYTHONPATH=${CODE:-$PWD}/agent
cd tests/data/blackbox/s40/repro/l49 && rankwatch analyze --json tl/*/attempt_0/*/*.log | python3 -c '
import json,sys; d=json.load(sys.stdin)
for r in d["ranks"]: print(r["path"], "rank", r["rank"], "steps", r["steps"], "last", r["last_step"])
for f in d["findings"]: print(f["severity"], f["kind"], "rank", f["rank"], "step", f["step"], f["path"].split("/",2)[-1], f["message"][:160])'
