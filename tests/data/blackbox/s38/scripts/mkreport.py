# builds the per-cell part of report.md (cells.md) from notebook.md (Cmd, Expect) and results.md (Got, Verdict).
# Controls and re-runs (g11b, g16r, g31r, g12x) are shown under their cell; a cell's verdict is its last verdict line.
import re, sys
from collections import Counter
nb = open("notebook.md").read()
cells = {}
for m in re.finditer(r"^### (g\d+[a-z]*) — (.*?)\n(.*?)(?=^### |^## |\Z)", nb, re.S | re.M):
    body = m.group(3)
    cmd = re.search(r"Cmd: (.*?)(?=\s*Expect[ :(])", body, re.S).group(1).strip()
    exp = re.search(r"Expect(.*)", body, re.S).group(1).strip()
    cells[m.group(1)] = (m.group(2), cmd, exp)
res = {}
cur = None
for l in open("results.md").read().splitlines():
    m = re.match(r"^## (g\d+)([a-z]*) ?(PASS|FAIL|UNCLEAR)?(.*)", l)
    if m:
        base, suf, v, note = m.group(1), m.group(2), m.group(3), m.group(4).strip(" —-")
        r = res.setdefault(base, {"verdict": None, "note": "", "got": []})
        cur = r
        if suf:
            r["got"].append(f"**{base}{suf}** ({v or ''}{' — ' + note if note else ''}):")
        elif v:
            r["verdict"], r["note"] = v, note
        continue
    if cur is not None and l.strip():
        cur["got"].append(l.replace("Got: ", "", 1))
main = sorted((k for k in cells if re.fullmatch(r"g\d+", k)), key=lambda k: int(k[1:]))
tab = ["| cell | situation | verdict |", "|---|---|---|"]
body = []
for k in main:
    title, cmd, exp = cells[k]
    r = res.get(k, {"verdict": "NOT RUN", "note": "", "got": ["(not run)"]})
    v = r["verdict"] or "NOT RUN"
    tab.append(f"| {k} | {title} | {'**FAIL**' if v == 'FAIL' else v}{' (' + r['note'] + ')' if r['note'] and v != 'PASS' else ''} |")
    extra = "".join(f"\n\n(control {c}: Cmd {cells[c][1]} — Expect {cells[c][2]})" for c in cells if c.startswith(k) and c != k)
    body.append(f"### {k} — {title}\nCmd (from /work/bb5): {cmd}\n\nExpect{exp}{extra}\n\nGot: " + "\n\n".join(r["got"]) + f"\n\nVerdict: **{v}**{' — ' + r['note'] if r['note'] else ''}\n")
open("cells.md", "w").write("\n".join(tab) + "\n\n## Every cell: Cmd / Expect / Got / Verdict\n\n" + "\n".join(body))
c = Counter((res.get(k) or {}).get("verdict") or "NOT RUN" for k in main)
p, f = c.get("PASS", 0), c.get("FAIL", 0)
print(dict(c), "of", len(main), "cells; first-seen", f"{p}/{p + f} = {100 * p / max(1, p + f):.0f}%")
