"""An unmodified-style PyTorch DDP client: env:// rendezvous from the variables trainctl sets,
a real gloo allreduce, and its result checked. Writes result-<rank>.json to $TRAINCTL_OUTPUT_DIR."""
import json
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])

t = torch.tensor([float(rank + 1), 1.0])
dist.all_reduce(t, op=dist.ReduceOp.SUM)
expected = [world * (world + 1) / 2, float(world)]
ok = t.tolist() == expected
print(f"rank {rank}/{world}: allreduce {t.tolist()} expected {expected} ok={ok}", flush=True)

out = os.path.join(os.environ["TRAINCTL_OUTPUT_DIR"], f"result-{rank}.json")
with open(out, "w") as f:
    json.dump({"rank": rank, "world": world, "sum": t.tolist(), "ok": ok,
               "local_rank": int(os.environ["LOCAL_RANK"]),
               "group_rank": int(os.environ["GROUP_RANK"])}, f)
dist.barrier()
dist.destroy_process_group()
raise SystemExit(0 if ok else 1)
