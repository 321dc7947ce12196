#!/bin/bash
# usage: HP=<hook port> cell.sh NAME TIMEOUT -- rankwatch-args...   ("@CFG" in args -> the per-cell config)
# per-cell folder /work/bb7/<NAME>: out.txt err.txt f.jsonl hook.jsonl rc.txt cfg.yaml; SIG (INT) sent at TIMEOUT
. /work/bb7/env.sh
name=$1; to=$2; shift 3
HP=${HP:-18790}
d=/work/bb7/$name; rm -rf $d; mkdir -p $d; cd $d
sed "s/18778/$HP/" ${CFGSRC:-/work/bb7/cfg.yaml} > $d/cfg.yaml
printf "runner:\n  log_dir: $d/logs\n" >> $d/cfg.yaml
python /work/bb7/${HOOK:-hook.py} $d/hook.jsonl $HP & hp=$!
args=(); for a in "$@"; do args+=("${a//@CFG/$d/cfg.yaml}"); done
echo "rankwatch ${args[*]}" > cmd.txt
start=$(date +%s)
timeout --preserve-status -s ${SIG:-INT} $to rankwatch "${args[@]}" >$d/out.txt 2>$d/err.txt; rc=$?
echo "rc=$rc elapsed=$(( $(date +%s)-start ))s load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%H:%M:%S)" | tee $d/rc.txt
sleep ${POST:-3}
kill $hp
python /work/bb7/show.py $d
echo "--- leftovers"; for p in /proc/[0-9]*; do c=$(readlink $p/cwd 2>/dev/null); case "$c" in $d*) [ "${p#/proc/}" != "$$" ] && echo "${p#/proc/} $(tr '\0' ' ' < $p/cmdline | cut -c1-150)";; esac; done
