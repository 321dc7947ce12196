import re
p='/work/notes/s35/blackbox2.md'; s=open(p).read()
cells=re.findall(r'^### (d\d+\w*) (.*?)\n.*?^Verdict: \*\*(PASS|FAIL|UNCLEAR)\*\*', s, flags=re.S|re.M)
P=sum(v=='PASS' for _,_,v in cells); F=sum(v=='FAIL' for _,_,v in cells); U=sum(v=='UNCLEAR' for _,_,v in cells)
rows='\n'.join(f'| {c} | {t[:150].replace("|","/")}{"…" if len(t)>150 else ""} | {"**FAIL**" if v=="FAIL" else v} |' for c,t,v in cells)
head=f"""## Summary

Cells tried: **{len(cells)}**. **PASS {P}, FAIL {F}, UNCLEAR {U}.** First-seen score = {P}/({P}+{F}) = **{P/(P+F):.2f}**.

| cell | form / situation | verdict |
|---|---|---|
{rows}
"""
start=s.index('## Summary'); end=s.index('## FAIL list') if '## FAIL list' in s else s.index('## Cells')
s=s[:start]+head+'\n'+s[end:]
open(p,'w').write(s)
print(len(cells),P,F,U)
