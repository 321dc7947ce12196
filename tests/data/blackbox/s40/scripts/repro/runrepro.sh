#!/bin/bash
# runs each repro once from the repository root on the code under test; output in tests/data/blackbox/s40/repro/rerun/
cd /work/wt/bb7
for r in rA rB rC rD rE rF; do echo "=== $r $(date -u +%T)"; CODE=/work/bbcode7 timeout 150 bash tests/data/blackbox/s40/scripts/repro/$r.sh > tests/data/blackbox/s40/repro/rerun/$r.txt 2>&1; echo "    rc=$? $(date -u +%T)"; done
