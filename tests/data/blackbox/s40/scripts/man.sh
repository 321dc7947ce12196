# sourced by manual cells: man.sh NAME HP -> cd /work/bb7/NAME, cfg.yaml ready, hook recorder up ($hp)
set -m   # job control: background agents keep SIGINT (a non-interactive shell would start them with SIGINT ignored)
. /work/bb7/env.sh
d=/work/bb7/$1; rm -rf $d; mkdir -p $d; cd $d
sed "s/18778/$2/" ${CFGSRC:-/work/bb7/cfg.yaml} > cfg.yaml; printf "runner:\n  log_dir: $d/logs\n" >> cfg.yaml
python /work/bb7/hook.py hook.jsonl $2 & hp=$!
leftovers() { for p in /proc/[0-9]*; do c=$(readlink $p/cwd 2>/dev/null); case "$c" in $d*) [ "${p#/proc/}" != "$$" ] && [ "${p#/proc/}" != "$hp" ] && echo "LEFT ${p#/proc/} $(tr '\0' ' ' < $p/cmdline | cut -c1-120)";; esac; done; }
finish() { sleep ${POST:-3}; kill $hp; python /work/bb7/show.py $d; echo "--- leftovers"; leftovers; }
