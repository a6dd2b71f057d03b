"""PyTorch DDP baseline for bench/fashion_mnist.py: the trainer's CNN, batch and thread count under
PyTorch's own DistributedDataParallel (gloo), started by torch.distributed.run.

Prints one JSON line per epoch from rank 0: epoch seconds (training only), test accuracy, and the
peak RSS of this rank; with --first-step, one when its first step is done (bench/k8s_side_by_side.py).
"""
import argparse, gzip, json, os, resource, time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def load(dir, split):
    def read(name):
        path = os.path.join(dir, name)
        opener = gzip.open if not os.path.exists(path) else open
        with opener(path if os.path.exists(path) else path + ".gz", "rb") as f:
            return f.read()
    images = np.frombuffer(read(f"{split}-images-idx3-ubyte"), np.uint8, offset=16)
    labels = np.frombuffer(read(f"{split}-labels-idx1-ubyte"), np.uint8, offset=8)
    return images.reshape(-1, 1, 28, 28), labels


class Cnn(nn.Module):  # the same layers, in the same order, as trainctl's models/models.cc
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--loader", choices=["tensor", "dataloader"], default="tensor",
                   help="tensor: index a pre-normalized tensor (the fastest way to feed DDP); "
                        "dataloader: a Dataset, DistributedSampler and DataLoader, as the "
                        "PyTorch tutorials write it")
    p.add_argument("--bf16", action="store_true",
                   help="bf16 autocast around the forward pass (the loss in f32), as "
                        "trainer.precision: bf16")
    p.add_argument("--first-step", action="store_true", help="print a line when the first step is done")
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    images, labels = load(a.data, "train")
    timages, tlabels = load(a.data, "t10k")
    x = torch.from_numpy(images.astype(np.float32) / 255.0)
    mean, std = x.mean().item(), x.std().item()
    x = (x - mean) / std
    y = torch.from_numpy(labels.astype(np.int64))
    tx = (torch.from_numpy(timages.astype(np.float32) / 255.0) - mean) / std
    ty = torch.from_numpy(tlabels.astype(np.int64))
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Cnn())
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    n = len(y) // world * world
    dataset = torch.utils.data.TensorDataset(x, y)
    sampler = torch.utils.data.DistributedSampler(dataset, world, rank, shuffle=True, seed=0,
                                                  drop_last=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=a.batch, sampler=sampler,
                                         drop_last=True)

    def batches(epoch):
        if a.loader == "dataloader":
            sampler.set_epoch(epoch)
            yield from loader
            return
        g = torch.Generator().manual_seed(epoch)
        shard = torch.randperm(len(y), generator=g)[:n][rank::world]
        for s in range(len(shard) // a.batch):
            idx = shard[s * a.batch:(s + 1) * a.batch]
            yield x[idx], y[idx]

    for epoch in range(a.epochs):
        start = time.time()
        for bx, by in batches(epoch):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                logits = model(bx)
            F.cross_entropy(logits.float(), by).backward()
            opt.step()
            if a.first_step and rank == 0:
                print(json.dumps({"first_step": time.time()}), flush=True)
                a.first_step = False
        seconds = time.time() - start
        with torch.no_grad():
            correct = (model.module(tx).argmax(1) == ty).sum().item()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if rank == 0:
            print(json.dumps({"epoch": epoch + 1, "epoch_seconds": seconds,
                              "epoch_samples_per_s": len(x) / seconds, "test_accuracy": correct / len(ty),
                              "peak_rss_mb": rss, "time": time.time()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
