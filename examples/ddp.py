"""A plain PyTorch DistributedDataParallel script, unchanged from what torchrun would run.

trainctl gives every worker RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ... so
init_process_group("gloo") finds its peers through env://. It fits y = 3x + 1 on data each rank
generates for itself, and at the end checks that every rank holds the same weights."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(1234 + rank)  # different data on every rank

model = DDP(torch.nn.Linear(1, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
steps = int(os.environ.get("STEPS", "100"))
for step in range(steps):
    x = torch.randn(64, 1)
    y = 3 * x + 1 + 0.01 * torch.randn(64, 1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()  # DDP allreduces the gradients here
    opt.step()
    if rank == 0 and (step % 20 == 0 or step == steps - 1):
        print(f"step {step:3d}  loss {loss.item():.5f}", flush=True)

w, b = model.module.weight.item(), model.module.bias.item()
mine = torch.tensor([w, b])
everyone = [torch.zeros(2) for _ in range(world)]
dist.all_gather(everyone, mine)
assert all(torch.equal(mine, other) for other in everyone), "ranks disagree on the weights"
if rank == 0:
    print(f"done: {world} workers agree on y = {w:.3f} x + {b:.3f}", flush=True)
dist.destroy_process_group()
