# prints the visible text of an HTML page (tags dropped, entities decoded), first N chars
import re, html, sys
t = open(sys.argv[1], encoding="utf-8", errors="replace").read()
t = re.sub(r"(?s)<style.*?</style>", " ", t); t = html.unescape(re.sub(r"<[^>]+>", " ", t))
print(re.sub(r"\s+", " ", t)[: int(sys.argv[2]) if len(sys.argv) > 2 else 3000])
