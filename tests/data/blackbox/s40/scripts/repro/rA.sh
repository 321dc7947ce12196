# l01: torchrun --role trainer --tee 3 ([trainerN]: prefixes), NaN on rank 1 from step 15. Every run: rank 0's pipeline takes each
# record twice (its evidence lists each grad norm twice: "(3.819, 3.132, 3.132, 3.977, 3.977)"; under --tee 3's [defaultN]: it
# is "(5.938, 3.611, 3.819, 3.132, 3.977)"). In the cell this gave a second alert, a false loss_divergence on healthy rank 0
# built from the doubled records; that part depends on timing: up to 4 attempts (~18 s each), stops at the first that shows it.
. tests/data/blackbox/s40/scripts/repro/setup.sh
for a in 1 2 3 4; do
  rm -rf f.jsonl logs dumps; : > hook.jsonl
  FAULT=nan FAULT_STEP=15 STEPS=30 $RW torchrun --nproc-per-node 2 --master-port $((29470 + a)) --role trainer --tee 3 $S/t7.py > out.txt 2> err.txt; echo "attempt $a rc=$?"; sleep 3
  grep -q loss_divergence hook.jsonl && break
done
python $S/show.py .; echo "--- the doubled records (deterministic):"; grep -o "Grad norm was flat before it ([^)]*)" f.jsonl | sort -u; kill $HP
