# loopback webhook recorder: appends every POST body as one JSON line to $1
import http.server, json, sys
out = sys.argv[1]; port = int(sys.argv[2])
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get('Content-Length') or 0); b = self.rfile.read(n)
        with open(out, 'ab') as f: f.write(b.replace(b'\n', b' ') + b'\n')
        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(('127.0.0.1', port), H).serve_forever()
