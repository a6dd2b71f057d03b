"""PyTorch DDP peer for bench/gpu.py and bench/weak_scaling.py: one model under
DistributedDataParallel, nccl on one GPU per rank (--device cuda) or gloo with OMP_NUM_THREADS
threads per rank (--device cpu), with the data already in the device's memory (the fastest way to
feed it), started with the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT).

Prints one JSON line per timed window from rank 0: {"window": k, "samples_per_s": ...}; on a GPU
the clock stops after torch.cuda.synchronize(), so queued work is counted.
"""
import argparse, json, os, time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddp_fashion_mnist import Cnn, load


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["cnn", "resnet18", "resnet50"], default="cnn")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist",
                   help="Fashion-MNIST directory, or 'synthetic:C,H,W'")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast around the forward pass")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--channels-last", action="store_true",
                   help="model and images in torch.channels_last (N,H,W,C)")
    p.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    a = p.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = a.device == "cuda"
    if cuda:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        torch.backends.cudnn.benchmark = a.cudnn_benchmark
    else:
        dev = torch.device("cpu")
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    if a.data.startswith("synthetic:"):
        c, h, w = (int(v) for v in a.data.split(":")[1].split(","))
        n = a.batch * 16
        x = torch.randn(n, c, h, w, device=dev)
        y = torch.randint(0, 10, (n,), device=dev)
    else:
        images, labels = load(a.data, "train")
        x = torch.from_numpy(images.copy()).to(dev).float().div_(255)
        x = (x - x.mean()) / x.std()
        y = torch.from_numpy(labels.astype("int64")).to(dev)
    if a.model == "cnn":
        model = Cnn()
    else:
        import torchvision
        model = getattr(torchvision.models, a.model)(num_classes=10)
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    x = x.contiguous(memory_format=fmt)
    model = torch.nn.parallel.DistributedDataParallel(model.to(dev, memory_format=fmt),
                                                      device_ids=[local] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator(device=dev).manual_seed(rank)

    def step():
        idx = torch.randint(0, len(y), (a.batch,), device=dev, generator=g)
        opt.zero_grad(set_to_none=False)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.bf16):
            logits = model(x[idx].contiguous(memory_format=fmt))
        F.cross_entropy(logits.float(), y[idx]).backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    sync()
    for k in range(a.windows):
        start = time.perf_counter()
        for _ in range(a.window):
            step()
        sync()
        seconds = time.perf_counter() - start
        if rank == 0:
            print(json.dumps({"window": k, "samples_per_s": a.window * a.batch * world / seconds}),
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
