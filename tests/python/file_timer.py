"""torch's real file timer client (what torchrun serves with TORCHELASTIC_ENABLE_FILE_TIMER=1): rank
1 takes a 1-second timer around a call that hangs; rank 0 works on. The agent must end rank 1 when
its timer expires."""
import os
import time

from torch.distributed.elastic.timer import FileTimerClient, configure, expires

rank = os.environ["RANK"]
configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
print(f"rank {rank} has a timer file", flush=True)
if rank == "1":
    with expires(after=1, scope="the hanging call"):
        time.sleep(120)
time.sleep(120)
