# accelerate (Accelerator(cpu=True)) under `accelerate launch --mixed_precision no`, batch s40. Every rank prints its own line.
#  FAULT=none|nan (rank FAULT_RANK from FAULT_STEP). Output: "[rank r] step N | loss X | lr 0.01" from every process
import os, time, torch
from accelerate import Accelerator
F = os.environ.get("FAULT", "none"); FS = int(os.environ.get("FAULT_STEP", "15")); FR = int(os.environ.get("FAULT_RANK", "1"))
acc = Accelerator(cpu=True)
torch.manual_seed(0)
m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(8192, 8); dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
m, opt, dl = acc.prepare(m, opt, dl)
r = acc.process_index
for step, (a, b) in enumerate(dl, 1):
    if step > int(os.environ.get("STEPS", "40")): break
    loss = torch.nn.functional.mse_loss(m(a), b)
    if r == FR and step >= FS and F == "nan": loss = loss * float("nan")
    acc.backward(loss); opt.step(); opt.zero_grad()
    print(f"[rank {r}] step {step} | loss {loss.item():.5f} | lr 0.01", flush=True)
    time.sleep(0.2)
acc.wait_for_everyone(); acc.print("training done")
