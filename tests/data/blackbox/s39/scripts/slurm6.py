# srun form: the script maps Slurm's variables to torch's itself (as many Slurm scripts do), then runs t6.main
import os, sys
os.environ["RANK"] = os.environ["SLURM_PROCID"]; os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ["MASTER_PORT"] = str(int(os.environ.get("MASTER_PORT", "29950")) + int(os.environ.get("SLURM_ARRAY_TASK_ID", "0")))
if os.environ["RANK"] == "0": print(f"slurm job {os.environ.get('SLURM_JOB_ID')} array task {os.environ.get('SLURM_ARRAY_TASK_ID')}", flush=True)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import t6; t6.main()
