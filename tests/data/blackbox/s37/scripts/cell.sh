#!/bin/bash
# usage: HP=<hook port> cell.sh NAME TIMEOUT -- rankwatch-args...   ("@CFG" in args -> per-cell config)
# per-cell folder /work/bb4/<NAME>: out.txt err.txt f.jsonl hook.jsonl rc.txt cfg.yaml
export PATH=/work/venv/bin:$PATH PYTHONPATH=/work/wt/blackbox4/agent:/work/bb4
name=$1; to=$2; shift 3
HP=${HP:-18790}
d=/work/bb4/$name; rm -rf $d; mkdir -p $d; cd $d
sed "s/18778/$HP/" ${CFGSRC:-/work/bb4/cfg.yaml} > $d/cfg.yaml
[ -z "$NOISOLATE" ] && printf "runner:\n  log_dir: $d/logs\n" >> $d/cfg.yaml
python /work/bb4/hook.py $d/hook.jsonl $HP & hp=$!
args=(); for a in "$@"; do args+=("${a//@CFG/$d/cfg.yaml}"); done
start=$(date +%s)
timeout --preserve-status -s ${SIG:-INT} $to $PREFIX rankwatch "${args[@]}" >$d/out.txt 2>$d/err.txt; rc=$?
echo "rc=$rc elapsed=$(( $(date +%s)-start ))s load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee $d/rc.txt
sleep ${POST:-3}
kill $hp
python /work/bb4/show.py $d
echo "--- leftovers"; for p in /proc/[0-9]*; do c=$(readlink $p/cwd 2>/dev/null); case "$c" in $d*) [ "${p#/proc/}" != "$$" ] && echo "${p#/proc/} $(tr '\0' ' ' < $p/cmdline | cut -c1-150)";; esac; done
