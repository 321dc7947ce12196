# loopback webhook recorder that answers 500 to the first FAILN POSTs, then 200: acked bodies -> $1 (hook.jsonl), refused -> rej.jsonl beside it
import http.server, sys, os
out = sys.argv[1]; port = int(sys.argv[2]); n = [0]; FAILN = int(os.environ.get("FAILN", "2"))
rej = os.path.join(os.path.dirname(os.path.abspath(out)), "rej.jsonl")
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        ln = int(self.headers.get('Content-Length') or 0); b = self.rfile.read(ln); n[0] += 1
        code = 500 if n[0] <= FAILN else 200
        with open(rej if code == 500 else out, 'ab') as f: f.write(b.replace(b'\n', b' ') + b'\n')
        self.send_response(code); self.end_headers(); self.wfile.write(b'boom' if code == 500 else b'ok')
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(('127.0.0.1', port), H).serve_forever()
