#!/usr/bin/env python3
"""Weak scaling of the built-in trainer on the CPU (issue 25, part 4), PyTorch DDP side by side.

The example CNN on Fashion-MNIST, batch 64 per worker, one compute thread per worker, N workers on
this machine for each N of --workers. Every configuration runs (windows + 1) x window steps; the
first window (start-up) is dropped and the median samples/s of the others is its throughput.

  efficiency(N) = throughput(N workers) / (N x throughput(1 worker)), target >= 0.9 at 16

Beside it in the same run:
  - N independent 1-worker trainctl jobs at once: what this machine gives N busy cores with no
    communication at all (shared caches, memory bandwidth, clock, hyper-threads). No data-parallel
    trainer can beat it: efficiency / this floor is what synchronizing costs.
  - PyTorch DDP (gloo) with the same model, batch and threads (bench/ddp_gpu.py --device cpu, the
    data already in memory), its own efficiency the same way.

Usage: bench/weak_scaling.py [--trainctl PATH] [--python PYTHON] [--workers 1,2,4,8,16]
"""
import argparse, os, statistics, subprocess, tempfile

from fashion_mnist import PYTHON
from gpu import ROOT, peer_rates, trainctl_rates, trainctl_start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainctl", default=os.path.join(ROOT, "build", "src", "trainctl"))
    ap.add_argument("--python", default=PYTHON, help="a python3 with torch (default: Debian's)")
    ap.add_argument("--workers", default="1,2,4,8,16")
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--no-peer", action="store_true", help="trainctl only")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-weak-")
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    for line in cpu.splitlines():
        if line.split(":")[0] in ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket",
                                  "Socket(s)", "L3"):
            print("#", line)
    args = dict(model="cnn", data="fashion-mnist", batch=64, device="cpu", threads=1,
                window=a.window, windows=a.windows)
    print("| workers | trainctl samples/s | trainctl efficiency | N independent 1-worker jobs, "
          "samples/s together | their efficiency (the machine's floor) | trainctl / independent jobs "
          "| PyTorch DDP samples/s | DDP efficiency | trainctl / DDP throughput |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = {}
    for n in [int(v) for v in a.workers.split(",")]:
        out = os.path.join(tmp, f"w{n}")
        ours = statistics.median(trainctl_rates(trainctl_start(a.trainctl, out, workers=n, **args), out))
        outs = [os.path.join(tmp, f"solo{n}-{k}") for k in range(n)]
        procs = [trainctl_start(a.trainctl, o, workers=1, **args) for o in outs]
        solo = [statistics.median(trainctl_rates(p, o)) for p, o in zip(procs, outs)]
        peer = None if a.no_peer else statistics.median(peer_rates(a.python, workers=n, **args))
        base.setdefault("ours", ours)
        base.setdefault("solo", solo[0])
        if peer:
            base.setdefault("peer", peer)
        eff = lambda v, k: v / (n * base[k])
        print(f"| {n} | {ours:.0f} | {eff(ours, 'ours'):.3f} | {sum(solo):.0f} | "
              f"{eff(sum(solo), 'solo'):.3f} | {ours / sum(solo):.3f} | "
              + (f"{peer:.0f} | {eff(peer, 'peer'):.3f} | {ours / peer:.2f}x |" if peer else "- | - | - |"),
              flush=True)


if __name__ == "__main__":
    main()
