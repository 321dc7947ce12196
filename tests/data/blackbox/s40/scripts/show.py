import json, sys, os, glob
d = sys.argv[1]
def cut(x, n=420): return str(x)[:n]
print("--- findings")
for p in sorted(glob.glob(os.path.join(d, "f*.jsonl"))):
    for l in open(p):
        try: f = json.loads(l)
        except Exception: print("RAW", l[:200]); continue
        print(cut({k: f.get(k) for k in ("kind", "rank", "step", "severity", "run", "user", "world_size", "message") if k in f}))
print("--- hook")
for p in sorted(glob.glob(os.path.join(d, "hook*.jsonl"))):
    for l in open(p):
        try: q = json.loads(l)
        except Exception: print("RAW", l[:300]); continue
        al = q.get("alerts", [q]) if isinstance(q, dict) else q
        for a in (al if isinstance(al, list) else [al]):
            print(cut({k: a.get(k) for k in ("status", "title", "kind", "rank", "run", "user", "suspect", "first_failure", "severity", "summary", "ranks", "world_size", "labels", "annotations", "id") if k in a}, 700))
if os.path.exists(os.path.join(d, "rej.jsonl")):
    print("--- refused with 500 (rej.jsonl)")
    for l in open(os.path.join(d, "rej.jsonl")):
        try: q = json.loads(l)
        except Exception: print("RAW", l[:300]); continue
        for a in (q.get("alerts", [q]) if isinstance(q, dict) else q):
            print(cut({k: a.get(k) for k in ("status", "title", "kind", "rank", "suspect", "id") if k in a}, 400))
