# builds report.md's per-cell section from notebook.md (Expect), cmds.txt (Cmd) and results.md (Got / Verdict)
import re, sys
nb = open('notebook.md').read().splitlines()
exp, cur = {}, None
for l in nb:
    m = re.match(r'^(f\d+b?) (.*)', l)
    if m: cur = m.group(1); exp[cur] = m.group(2); continue
    if cur and l.startswith('    '): exp[cur] += ' ' + l.strip()
    else: cur = None
cmd = {}
for l in open('cmds.txt'):
    k, _, v = l.partition(': '); cmd.setdefault(k.strip(), []).append(v.strip())
res, cur = {}, None
for l in open('results.md').read().splitlines():
    m = re.match(r'^## (f\d+b?) (PASS|FAIL|UNCLEAR)(.*)', l)
    if m: cur = m.group(1); res[cur] = [m.group(2) + m.group(3), []]; continue
    m = re.match(r'^## (f\d+)\S* re-runs', l)
    if m: cur = m.group(1); res[cur][1].append('Re-runs:'); continue
    if cur and l.strip(): res[cur][1].append(l.replace('Got: ', '', 1))
def short(s): s = re.sub(r'\s+', ' ', s).split(' Expect:')[0]; return s[:150] + ('…' if len(s) > 150 else '')
order = sorted(exp, key=lambda k: (int(re.sub(r'\D', '', k)), k))
tab = ['| cell | situation | verdict |', '|---|---|---|']
body = []
for k in order:
    v = res.get(k, ['NOT RUN', []])[0].split()[0]
    tab.append(f'| {k} | {short(exp[k])} | {"**FAIL**" if v == "FAIL" else v} |')
    body.append(f'### {k}\nCmd (from /work/bb4, scripts/cell.sh etc.): ' + ' ; '.join('`' + c + '`' for c in cmd.get(k, []) + [c for kk, cs in cmd.items() if kk.startswith(k) and kk != k and kk[len(k):] in ('r', 's', 'b') and kk not in exp for c in cs]) +
                f'\n\nExpect: {exp[k]}\n\nGot: ' + ' '.join(res.get(k, ['', ['(not run)']])[1]) + f'\n\nVerdict: {res.get(k, ["NOT RUN"])[0]}\n')
open('cells.md', 'w').write('\n'.join(tab) + '\n\n## Cells: Cmd / Expect / Got / Verdict\n\n' + '\n'.join(body))
from collections import Counter
c = Counter(res[k][0].split()[0] for k in order if k in res); print(c, len(order))
