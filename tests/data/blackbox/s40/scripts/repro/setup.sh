# repro setup (source it from the repository root): PYTHONPATH is the tree under test (CODE, default: this checkout); stop the recorder with `kill $HP`
export PATH=/work/venv/bin:$PATH PYTHONPATH=${CODE:-$PWD}/agent S=$PWD/tests/data/blackbox/s40/scripts OMP_NUM_THREADS=1
W=$(mktemp -d) && cd $W && { python $S/hook.py hook.jsonl ${HOOKPORT:-19290} & HP=$!; } && sleep 0.5
printf 'alerts: {startup_quiet: 0s, group_wait: 2s, webhook: {urls: ["http://127.0.0.1:%s/hook"]}}\nstall: {startup_grace: 40s, floor: 10s, silent_rank_timeout: 20s}\nrunner: {log_dir: %s/logs}\n' ${HOOKPORT:-19290} $W > cfg.yaml
RW="rankwatch run -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --"
