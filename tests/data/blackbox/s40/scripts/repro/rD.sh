# l31: Lightning 2.6 DDP devices=2, no print lines, Rich bar + CSVLogger (its v_num pushes `train_loss: nan` onto the bar's
# second line), NaN on rank 1 from step 10 -> no finding, no alert at all. ~25 s
. tests/data/blackbox/s40/scripts/repro/setup.sh
PRINT=0 FAULT=nan FAULT_STEP=10 STEPS=40 LOG_EVERY=5 MASTER_PORT=29474 $RW python $S/pl7.py > out.txt 2> err.txt; echo "rc=$?"; sleep 3
python $S/show.py .; echo "--- the log's last lines"; tail -c 400 logs/*.log; echo; tail -2 csv/lightning_logs/version_0/metrics.csv; kill $HP
