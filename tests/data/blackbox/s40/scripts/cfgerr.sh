#!/bin/bash
# cfgerr.sh NAME 'command' : a config-mistake cell; bad1.yaml (unknown nested key) and bad2.yaml (wrong type) written into the cell folder
. /work/bb7/env.sh
d=/work/bb7/$1; rm -rf $d; mkdir -p $d; cd $d
printf 'alerts:\n  startup_quiet: 0s\n  webhook:\n    urlz: ["http://127.0.0.1:19299/hook"]\nstall:\n  floor: 10s\n' > bad1.yaml
printf 'stall:\n  startup_grace: 40s\n  floor: ten seconds\n' > bad2.yaml
echo "$2" > cmd.txt
timeout -s INT 40 bash -c "$2" > out.txt 2> err.txt; echo "rc=$? at=$(date -u +%T)" | tee rc.txt
echo "--- stdout"; head -c 1500 out.txt; echo "--- stderr"; head -c 1500 err.txt
echo "--- leftovers"; for p in /proc/[0-9]*; do c=$(readlink $p/cwd 2>/dev/null); case "$c" in $d*) [ "${p#/proc/}" != "$$" ] && echo "${p#/proc/} $(tr '\0' ' ' < $p/cmdline | cut -c1-150)";; esac; done
