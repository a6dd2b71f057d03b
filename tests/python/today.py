"""DDP programs as their users write them, 2 ranks on gloo:

  today.py ckpt      checkpoints with torch.save every 5 steps (rank 0); in the first attempt
                     rank 1 fails at step 12, and the group resumes from step 10 (torch 1.13 too)

and programs of today's PyTorch, 2.x only (issue 74, part 3):

  today.py compile   DDP of a torch.compile'd model (inductor: C++ kernels built by its compile
                     workers, processes of their own)
  today.py dcp       checkpoints with torch.distributed.checkpoint every 5 steps; rank 1 is
                     SIGKILLed at step 12 the first time (RESULT_DIR/killed says it was), and
                     the group (restarted, or started again) resumes from step 10
  today.py fsdp2     the model sharded with FSDP2's fully_shard on a CPU device mesh

Each trains a small MLP for 20 steps on data drawn from (step, rank) and writes
$RESULT_DIR/result-RANK.json: every step's loss and the final parameters (exactly, as float.hex),
the step it resumed from, and whether its interpreter was warm (xml.dom.minidom preloaded), so
runs under torchrun and from a warm interpreter can be compared value for value.
"""
import sys

preloaded = "xml.dom.minidom" in sys.modules
import json
import os
import signal

import torch
import torch.distributed as dist

mode = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
out = os.environ["RESULT_DIR"]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

if mode == "compile":
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(torch.compile(net))
    params = net.parameters
elif mode == "fsdp2":
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    model = fully_shard(net, mesh=mesh)
    params = lambda: (p.full_tensor() for p in net.parameters())  # each a DTensor: its shards gathered
else:
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(net)
    params = net.parameters
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

start = 0
ckpt = os.path.join(out, "ckpt")
if mode == "ckpt" and os.path.exists(ckpt):
    state = torch.load(ckpt)
    net.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
if mode == "dcp":
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    latest = os.path.join(ckpt, "latest")
    if os.path.exists(latest):
        with open(latest) as f:
            start = int(f.read())
        model_state, opt_state = get_state_dict(model, opt)
        state = {"model": model_state, "opt": opt_state}
        dcp.load(state, checkpoint_id=os.path.join(ckpt, str(start)))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["opt"])

losses = []
for step in range(start, 20):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 8, generator=g)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
    if mode == "ckpt" and step == 12 and rank == 1 and attempt == "0":
        sys.exit(1)
    if mode == "ckpt" and (step + 1) % 5 == 0:
        dist.barrier()
        if rank == 0:
            torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step + 1}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
        dist.barrier()
    if mode == "dcp" and step == 12 and rank == 1 and not os.path.exists(os.path.join(out, "killed")):
        open(os.path.join(out, "killed"), "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "dcp" and (step + 1) % 5 == 0:
        model_state, opt_state = get_state_dict(model, opt)
        dcp.save({"model": model_state, "opt": opt_state}, checkpoint_id=os.path.join(ckpt, str(step + 1)))
        dist.barrier()
        if rank == 0:
            with open(latest + ".tmp", "w") as f:
                f.write(str(step + 1))
            os.replace(latest + ".tmp", latest)

weights = [v.hex() for p in params() for v in p.detach().flatten().tolist()]
with open(os.path.join(out, "result-%d.json" % rank), "w") as f:
    json.dump({"preloaded": preloaded, "resumed_from": start, "losses": [v.hex() for v in losses],
               "weights": weights}, f)
dist.destroy_process_group()
