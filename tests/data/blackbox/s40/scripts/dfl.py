# dfl.py CMD...: exec CMD with SIGINT/SIGQUIT/SIGHUP back at their defaults (a `cmd &` from a non-interactive shell
# inherits them ignored, and a shell cannot un-ignore what it inherited ignored)
import os, signal, sys
for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ): signal.signal(s, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])
