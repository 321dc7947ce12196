# srun form: the script maps Slurm's variables to torch's itself (as many Slurm scripts do), then runs t7.main
import os, sys
os.environ["RANK"] = os.environ["SLURM_PROCID"]; os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29480")
if os.environ["RANK"] == "0": print(f"slurm job {os.environ.get('SLURM_JOB_ID')} restart {os.environ.get('SLURM_RESTART_COUNT', '0')}", flush=True)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import t7; t7.main()
