# G (g31): a DCP save with its data file cut passes as good (also --deep)
CKPT_DIR=ck CKPT_KIND=dcp CKPT_EVERY=5 STEPS=10 STEP_DELAY=0 torchrun --nproc-per-node 2 --master-port 29905 $S/t5.py > out.txt 2>&1
truncate -s 1500 ck/step00010/__0_0.distcp; rankwatch checkpoints ck --settle 0 --deep; echo "rc=$?"
