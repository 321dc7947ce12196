# builds report.md's cell table and per-cell section from notebook.md (expectations), results.md (Got, verdict), cells.txt (Cmd)
import re, sys, os
here = os.path.dirname(os.path.abspath(__file__))
def sections(path):
    out, cur = {}, None
    for line in open(os.path.join(here, path)):
        m = re.match(r"### (l\d+) ?(.*)", line)
        if m:
            cur = m.group(1); out[cur] = [m.group(2).strip(), ""]; continue
        if line.startswith("## "): cur = None; continue
        if cur: out[cur][1] += line
    return out
nb, rs = sections("notebook.md"), sections("results.md")
cmds = dict(l.rstrip("\n").split("\t", 1) for l in open(os.path.join(here, "cells.txt")) if "\t" in l)
order = sorted(nb, key=lambda c: int(c[1:]))
table, body = ["| cell | situation | verdict |", "|---|---|---|"], []
for c in order:
    title, expect = nb[c]
    got = rs.get(c, ["", "Got: not run\nVerdict: not run\n"])[1]
    m = re.search(r"^Verdict: (\w+)(.*)$", got, re.M)
    v, why = (m.group(1), m.group(2).strip()) if m else ("?", "")
    vv = f"**{v}**" if v == "FAIL" else v
    if why and v != "PASS": vv += f" {why}"
    table.append(f"| {c} | {title.replace('|', '/')} | {vv} |")
    body.append(f"### {c} {title}\nCmd: `{cmds.get(c, '?')}`\n{expect.strip()}\n{got.strip()}\n")
print("\n".join(table)); print("\n## Every cell: Cmd / Expect / Got / Verdict\n"); print("\n".join(body))
