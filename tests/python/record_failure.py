"""A program decorated with torch's real @record (torch.distributed.elastic): each rank raises.
Rank 1 raises first but exits late (an atexit handler keeps it alive), rank 0 raises a few
seconds later and exits at once: the first to exit is not the first to fail."""
import atexit
import os
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    rank = int(os.environ["RANK"])
    if rank == 1:
        atexit.register(time.sleep, 30)
        raise ValueError("rank 1 failed first")
    time.sleep(2.5)
    raise RuntimeError("rank 0 failed second")


if __name__ == "__main__":
    main()
