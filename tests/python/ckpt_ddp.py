"""A DDP program that checkpoints every 5 steps and resumes from its latest checkpoint: rank 1
fails at step 12 of the first attempt, the group restarts from step 10. Writes the final weights
(exactly, as float.hex) to $RESULT_DIR/weights.json, with whether it started warm."""
import sys

preloaded = "xml.dom.minidom" in sys.modules
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
out = os.environ["RESULT_DIR"]
ckpt = os.path.join(out, "ckpt.pt")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
start = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
for step in range(start, 20):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 8, generator=g)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 12 and rank == 1 and attempt == "0":
        sys.exit(1)
    if (step + 1) % 5 == 0:
        dist.barrier()
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step + 1}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
        dist.barrier()
if rank == 0:
    weights = [v.hex() for p in model.module.parameters() for v in p.detach().flatten().tolist()]
    with open(os.path.join(out, "weights.json"), "w") as f:
        json.dump({"preloaded": preloaded, "resumed_from": start, "weights": weights}, f)
dist.destroy_process_group()
