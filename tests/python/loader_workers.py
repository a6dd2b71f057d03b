"""A program with DataLoader worker processes (forked) and a multiprocessing spawn pool: writes
what they computed, and whether it started with the warm interpreter's xml.dom.minidom loaded,
to $RESULT_DIR/result-RANK.json."""
import sys

preloaded = "xml.dom.minidom" in sys.modules
import json
import multiprocessing
import os

import torch
from torch.utils.data import DataLoader, Dataset


class Noisy(Dataset):
    """Items drawn in the loader's worker processes from torch's generator, seeded per worker."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.rand(2) + i


def square(x):
    return x * x


if __name__ == "__main__":
    torch.manual_seed(7 + int(os.environ["RANK"]))
    loader = DataLoader(Noisy(), batch_size=8, num_workers=2)
    batches = [b.sum().item() for b in loader]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        spawned = pool.map(square, range(5))
    with open(os.path.join(os.environ["RESULT_DIR"], "result-%s.json" % os.environ["RANK"]), "w") as f:
        json.dump({"preloaded": preloaded, "batches": batches, "spawned": spawned}, f)
