"""The worker of bench/torchrun.py: says when it started (before importing torch), then trains a
toy model with DDP over gloo, printing each step with the restart count, until it is stopped."""
import os
import time

print("started %.6f pid %d rank %s restart %s" % (time.time(), os.getpid(), os.environ["RANK"],
                                                  os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), flush=True)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
for step in range(1000000):
    x = torch.randn(32, 16)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if dist.get_rank() == 0:
        print("step %d restart %s %.6f" % (step, restart, time.time()), flush=True)
    if step == 0:  # every rank's first step (bench/torchrun.py start-up)
        print("first step rank %d restart %s %.6f" % (dist.get_rank(), restart, time.time()), flush=True)
    time.sleep(0.05)
