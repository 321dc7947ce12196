import re, sys
sys.path.insert(0, '/work/bb3'); from cmds import C
s = open('/work/bb3/cells.md').read()
exp, got, title = {}, {}, {}
cur = None
for line in s.splitlines():
    m = re.match(r'^### (e\d\d)\b(.*)', line)
    if m:
        cur = m.group(1); t = m.group(2).strip()
        title.setdefault(cur, t); exp.setdefault(cur, []).append(line[4:]); continue
    if line.startswith('## '): cur = None; continue
    m = re.match(r'^(e\d\d)\b', line)
    if m and not line.startswith('### '):
        got.setdefault(m.group(1), []).append(line); cur = None; continue
    if cur and line.strip(): exp[cur].append(line)
cells = sorted(set(exp) | set(got))
ver = {}
for c in cells:
    v = re.findall(r'\*\*(PASS|FAIL|UNCLEAR)\*\*', ' '.join(got.get(c, [])))
    ver[c] = v[-1] if v else 'NOT RUN'
P = sum(v == 'PASS' for v in ver.values()); F = sum(v == 'FAIL' for v in ver.values()); U = sum(v == 'UNCLEAR' for v in ver.values())
score = P / (P + F)
def short(t):
    t = re.sub(r'\s+', ' ', t).replace('|', '/')
    return t[:170] + ('…' if len(t) > 170 else '')
out = []
out.append(f'# s36 black-box report (issue 28) — cells, FAIL list, Cmd / Expect / Got / Verdict\n')
out.append(f'Cells: **{len(cells)}** — PASS {P}, FAIL {F}, UNCLEAR {U}. First-seen score P/(P+F) = {P}/{P+F} = **{score:.0%}**.\n')
out.append('| cell | situation | verdict |\n|---|---|---|')
for c in cells:
    v = ver[c]; out.append(f'| {c} | {short(title.get(c, ""))} | {"**FAIL**" if v == "FAIL" else v} |')
out.append('\n' + open('/work/bb3/faillist.md').read())
out.append('\n## Cells\n')
out.append('Harness: `/work/bb3/cell.sh NAME TIMEOUT -- <rankwatch args>` (copy in scripts/): per-cell folder with out.txt, err.txt, f.jsonl (findings), hook.jsonl (webhook bodies from `hook.py` on port HP), rc.txt; config = cfg.yaml with the cell\'s webhook port (and, from e19 on, `runner.log_dir: <cell>/logs`). `R` = `run -c @CFG --no-server --findings-jsonl f.jsonl --dumps-dir dumps --`. PATH=/work/venv/bin, PYTHONPATH=/work/wt/blackbox3/agent (commit 172d0c4).\n')
for c in cells:
    out.append(f'### {c} {title.get(c, "")}\n')
    out.append(f'Cmd: `{C.get(c, "(see Got)")}`\n')
    out.append('Expect (written before the run):\n')
    for l in exp.get(c, [])[0:]:
        if l.startswith(c): l = '— ' + l
        out.append('> ' + l)
    out.append('')
    out.append('Got:\n')
    for l in got.get(c, []): out.append('- ' + l)
    out.append(f'\nVerdict: **{ver[c]}**\n')
open('/work/wt/blackbox3/tests/data/blackbox/s36/report.md', 'w').write('\n'.join(out) + '\n')
print(len(cells), P, F, U, f'{score:.3f}', [c for c in cells if ver[c] == 'FAIL'], [c for c in cells if ver[c] == 'NOT RUN'])
