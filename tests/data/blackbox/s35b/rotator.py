# stdin -> PATH; after N lines rename PATH to PATH.1 and create a new PATH (logrotate rename+create with a writer that reopens)
import sys, os
path, n = sys.argv[1], int(sys.argv[2]); f = open(path, "a"); i = 0
for line in sys.stdin:
    f.write(line); f.flush(); i += 1
    if i == n:
        f.close(); os.rename(path, path + ".1"); f = open(path, "a")
        print(f"rotated {path} after {n} lines", file=sys.stderr, flush=True)
