#!/bin/bash
# pilotall.sh CELL...: dry-run of the harness with the stand-in shim (NOT rankwatch) on PATH; consoles in console-dry/
cd /work/bb7; mkdir -p console-dry; export SHIM=/work/bb7/shim
for c in "$@"; do cmd=$(awk -F'\t' -v c=$c '$1==c{print $2}' cells.txt)
  echo "=== $c $(date -u +%T)" | tee -a console-dry/runlog.txt
  ( cd /work/bb7 && bash -c "$cmd" ) > console-dry/$c.txt 2>&1 < /dev/null
  echo "    done $(date -u +%T)" | tee -a console-dry/runlog.txt
  for p in /proc/[0-9]*; do cwd=$(readlink $p/cwd 2>/dev/null); case "$cwd" in /work/bb7/$c|/work/bb7/$c/*) pid=${p#/proc/}; echo "    leftover $pid $(tr '\0' ' ' < $p/cmdline | cut -c1-100)" | tee -a console-dry/runlog.txt; kill -9 $pid 2>/dev/null;; esac; done
done
