# accelerate (Accelerator(cpu=True)) under `accelerate launch`, batch s39 (acc5.py + FAULT=crash inside acc.accumulate). Every step gathers the loss (all_gather) for a metric.
#  FAULT=none|hang_gather (rank FAULT_RANK sleeps at FAULT_STEP; the other waits in accelerator.gather)|nan (rank FAULT_RANK)
#  Output: accelerator.print (main process only): "step N | loss X | mean gathered loss Y"
import os, time, torch
from accelerate import Accelerator
F = os.environ.get("FAULT", "none"); FS = int(os.environ.get("FAULT_STEP", "15")); FR = int(os.environ.get("FAULT_RANK", "1"))
acc = Accelerator(cpu=True, gradient_accumulation_steps=int(os.environ.get("ACCUM", "1")))
torch.manual_seed(0)
m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(8192, 8); dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
m, opt, dl = acc.prepare(m, opt, dl)
r = acc.process_index
for step, (a, b) in enumerate(dl, 1):
    if step > int(os.environ.get("STEPS", "40")): break
    with acc.accumulate(m):
        loss = torch.nn.functional.mse_loss(m(a), b)
        if r == FR and step >= FS and F == "nan": loss = loss * float("nan")
        if r == FR and step == FS and F == "crash": raise RuntimeError(f"shard {step} of rank {r}: corrupt record in accumulate block")
        acc.backward(loss); opt.step(); opt.zero_grad()
    if r == FR and step == FS and F == "hang_gather":
        while True: time.sleep(1)
    g = acc.gather(loss.detach().reshape(1))
    acc.print(f"step {step} | loss {loss.item():.5f} | mean gathered loss {g.mean().item():.5f}")
    time.sleep(0.2)
acc.wait_for_everyone(); acc.print("training done")
