#!/bin/bash
# pilotall.sh CELL...: dry run of the named cells with the stand-in shim (NOT rankwatch); console in pilot/console/
cd /work/bb6; mkdir -p pilot/console; export SHIM=/work/bb6/shim
for c in "$@"; do
  cmd=$(awk -F'\t' -v c=$c '$1==c{print $2}' cells.txt)
  echo "=== $c $(date -u +%T)" >> pilot/console/runlog.txt
  ( bash -c "$cmd" ) > pilot/console/$c.txt 2>&1 < /dev/null
  echo "    done $(date -u +%T)" >> pilot/console/runlog.txt
  for p in /proc/[0-9]*; do cwd=$(readlink $p/cwd 2>/dev/null); case "$cwd" in /work/bb6/$c|/work/bb6/$c/*) pid=${p#/proc/}; echo "    killing leftover $pid $(tr '\0' ' ' < $p/cmdline | cut -c1-100)" >> pilot/console/runlog.txt; kill -9 $pid 2>/dev/null;; esac; done
done
echo "PILOT DONE $(date -u +%T)" >> pilot/console/runlog.txt
