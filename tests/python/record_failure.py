"""A program decorated with torch's real @record (torch.distributed.elastic): each rank raises.
Rank 1 raises first but exits late (an atexit handler keeps it alive), rank 0 raises a few
seconds later and exits at once: the first to exit is not the first to fail.
With SAME_SECOND=<unix second> both raise within that second of the clock (rank 1 at .1 s, still
exiting late; rank 0 at .4 s), so torch's whole-second timestamps tie and only finer times tell
which failed first."""
import atexit
import os
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    rank = int(os.environ["RANK"])
    if "SAME_SECOND" in os.environ:
        second = int(os.environ["SAME_SECOND"])
        time.sleep(max(0.0, second + (0.1 if rank == 1 else 0.4) - time.time()))
        if rank == 1:
            atexit.register(time.sleep, 30)
        raise (ValueError if rank == 1 else RuntimeError)(f"rank {rank} failed")
    if rank == 1:
        atexit.register(time.sleep, 30)
        raise ValueError("rank 1 failed first")
    time.sleep(2.5)
    raise RuntimeError("rank 0 failed second")


if __name__ == "__main__":
    main()
