# accelerate's own API and logging: Accelerator + accelerate.logging.get_logger, launched by `accelerate launch`.
# FAULT=nan: rank FAULT_RANK's loss NaN from FAULT_STEP; FAULT=crash: raises there; FAULT=hang: sleeps there.
import os, time, logging, torch
from accelerate import Accelerator
from accelerate.logging import get_logger
logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", datefmt="%m/%d/%Y %H:%M:%S", level=logging.INFO)
log = get_logger(__name__)
F = os.environ.get("FAULT", "none"); FS = int(os.environ.get("FAULT_STEP", "15")); FR = int(os.environ.get("FAULT_RANK", "1"))
acc = Accelerator(cpu=True)
m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(1024, 8); dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
m, opt, dl = acc.prepare(m, opt, dl)
r = acc.process_index
for step, (a, b) in enumerate(dl, 1):
    if step > int(os.environ.get("STEPS", "40")): break
    loss = torch.nn.functional.mse_loss(m(a), b)
    if r == FR and step >= FS and F == "nan": loss = loss * float("nan")
    if r == FR and step == FS and F == "crash": raise RuntimeError(f"injected failure in rank {r} at step {step}")
    if r == FR and step == FS and F == "hang":
        while True: time.sleep(1)
    opt.zero_grad(); acc.backward(loss); opt.step()
    log.info(f"step {step}: loss {loss.item():.5f} lr 0.01", main_process_only=False)
    time.sleep(0.2)
acc.wait_for_everyone(); acc.print("training done")
