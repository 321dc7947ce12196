# srun form: the script maps Slurm's variables to torch's itself, then runs t3.py's main
import os
os.environ["RANK"] = os.environ["SLURM_PROCID"]; os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29633")
import t3; t3.main()
