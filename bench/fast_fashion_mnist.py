#!/usr/bin/env python3
"""Time to 0.91 Fashion-MNIST test accuracy (issue 25, part 1): trainctl's example beside the
best plain-PyTorch recipe found for this machine, run alternately, MLPerf-style.

  peer      this file with --peer: one process, 2 threads, a small CNN with batch norm (--model
            bn; --model example: the example's own CNN, no batch norm, its lr 0.2), bf16
            autocast where the CPU multiplies bf16 in hardware (AVX-512 BF16, AMX; elsewhere
            PyTorch emulates it, several times slower than fp32, so fp32: --precision auto),
            a one-cycle schedule, label smoothing, the test set evaluated once at the end. Wall time from `python3` starting to the
            accuracy printed (interpreter, torch import and data decode included).
  trainctl  `trainctl run examples/fashion-mnist.yaml`: wall time from start to exit
            (launcher, agents, LibTorch load, data decode, training, eval, the model written).

The peer runs on --python's torch (default Debian's 1.13; `scripts/dev pytorch-env`'s for today's),
with --compile 1 its model through torch.compile (inductor; the compile counted in its time, as a
user waits for it: the first steps, and the evaluation's other shape).

A run that ends under 0.91 counts as the slowest (MLPerf); with >= 5 runs the fastest and the
slowest are dropped and the rest averaged. Usage:
  bench/fast_fashion_mnist.py [--runs 5] [--python PATH] [--compile 0|1] [--trainctl build/src/trainctl]
The same comparison through `trainctl bench`: bench/time-to-accuracy.matrix.yaml.
"""
import argparse, gzip, json, os, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = 0.91


def native_bf16():
    """Whether this CPU has bf16 arithmetic (what trainctl's trainer.precision: bf16 also asks)."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def peer(a):
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(2)
    torch.manual_seed(a.seed)

    def load(split):
        def read(name):
            path = os.path.join(a.data, name)
            if os.path.exists(path):
                return open(path, "rb").read()
            return gzip.open(path + ".gz", "rb").read()
        x = np.frombuffer(read(f"{split}-images-idx3-ubyte"), np.uint8, offset=16).reshape(-1, 1, 28, 28)
        y = np.frombuffer(read(f"{split}-labels-idx1-ubyte"), np.uint8, offset=8)
        x = (torch.from_numpy(x.copy()).float() / 255 - 0.2860) / 0.3530
        return x, torch.from_numpy(y.astype(np.int64))

    xtr, ytr = load("train")
    xte, yte = load("t10k")
    if a.model == "bn":
        model = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 10))
    elif a.model == "recipe":  # issue 48's recipe; examples/your-model.yaml declares the same layers
        model = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.MaxPool2d(2), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 48, 3, stride=2, padding=1), nn.BatchNorm2d(48), nn.ReLU(),
            nn.Conv2d(48, 96, 3, stride=2, padding=1), nn.BatchNorm2d(96), nn.ReLU(),
            nn.Flatten(), nn.Linear(96 * 4 * 4, 10))
    else:  # trainctl's example CNN, layer for layer (docs/job-spec.md, trainer.model: cnn)
        model = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
        xtr = xtr.contiguous(memory_format=torch.channels_last)
        xte = xte.contiguous(memory_format=torch.channels_last)
    if a.compile:
        model = torch.compile(model)
    steps_per_epoch = len(xtr) // a.batch
    total = steps_per_epoch * a.epochs
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=total)
    bf16 = a.precision == "bf16" or (a.precision == "auto" and native_bf16())
    model.train()
    epoch_seconds = []
    for epoch in range(a.epochs):
        began = time.time()
        perm = torch.randperm(len(xtr))
        for s in range(steps_per_epoch):
            idx = perm[s * a.batch:(s + 1) * a.batch]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(model(xtr[idx]), ytr[idx], label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        epoch_seconds.append(time.time() - began)
    model.eval()
    correct = 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for i in range(0, len(xte), 1000):
            correct += (model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item()
    # What `trainctl bench` reads from a peer (docs/bench.md): the accuracy and when it was known.
    print(json.dumps({"test_accuracy": correct / len(xte), "time": time.time(), "precision": "bf16" if bf16 else "fp32",
                      "epoch_seconds": epoch_seconds}))


def timed(argv, env=None):
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    return time.monotonic() - t0, p


def mlperf(times):
    """Drop the fastest and the slowest (a missed run is the slowest), mean and std of the rest;
    no figure when a missed run is among those kept (as `trainctl bench` scores it)."""
    ordered = sorted(times, key=lambda t: float("inf") if t is None else t)
    kept = ordered[1:-1] if len(ordered) >= 5 else ordered
    if not kept or None in kept:
        return None, None
    return statistics.mean(kept), statistics.stdev(kept) if len(kept) > 1 else 0.0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--peer", action="store_true", help="run the PyTorch recipe itself (internal)")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--model", choices=["bn", "example", "recipe"], default="bn",
                   help="bn: a CNN with batch norm (the fastest recipe on AVX-512 with bf16); example: "
                        "trainctl's example CNN (the fastest found in fp32 on an AVX2 CPU); recipe: issue 48's "
                        "3-convolution batch-norm CNN, channels-last (examples/your-model.yaml's layers)")
    p.add_argument("--lr", type=float, help="the peak of the one-cycle schedule (0.1 for bn, 0.2 for example)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                   help="the peer's autocast: auto is bf16 where the CPU has bf16 instructions, else fp32")
    p.add_argument("--channels-last", dest="channels_last", type=int, choices=[0, 1],
                   help="the peer's model and batches channels-last (default: 1 for recipe, else 0)")
    p.add_argument("--compile", type=int, choices=[0, 1], default=0, help="the peer's model through torch.compile")
    p.add_argument("--python", default="/usr/bin/python3", help="the peer's Python (Debian's has python3-torch)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--trainctl", default=os.path.join(ROOT, "build/src/trainctl"))
    p.add_argument("--spec", default=os.path.join(ROOT, "examples/fashion-mnist.yaml"))
    a = p.parse_args()
    if a.lr is None:
        a.lr = 0.1 if a.model == "bn" else 0.2
    if a.channels_last is None:
        a.channels_last = a.model == "recipe"
    if a.peer:
        return peer(a)
    # The peer as PyTorch's speed guides run it: tcmalloc preloaded where the machine has it.
    peer_env = dict(os.environ)
    for lib in ("/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4", "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"):
        if os.path.exists(lib):
            peer_env["LD_PRELOAD"] = lib
            break
    results = {"trainctl": [], "pytorch": []}
    accuracy = {"trainctl": [], "pytorch": []}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(a.runs):
            out = os.path.join(tmp, f"run{run}")
            secs, proc = timed([a.trainctl, "--log-level", "warn", "run", a.spec, "--set", f"output_dir={out}",
                                "--set", f"trainer.seed={run}"])
            if proc.returncode != 0:
                sys.exit(f"trainctl failed:\n{proc.stdout}{proc.stderr}")
            acc = [json.loads(l)["test_accuracy"] for l in open(os.path.join(out, "metrics.jsonl")) if "test_accuracy" in l]
            accuracy["trainctl"].append(acc[-1])
            results["trainctl"].append(secs if acc[-1] >= TARGET else None)
            secs, proc = timed([a.python, os.path.abspath(__file__), "--peer", "--compile", str(a.compile), "--seed", str(run), "--epochs", str(a.epochs),
                                "--batch", str(a.batch), "--lr", str(a.lr), "--data", a.data, "--precision", a.precision,
                                "--model", a.model, "--channels-last", str(int(a.channels_last))], env=peer_env)
            if proc.returncode != 0:
                sys.exit(f"the PyTorch peer failed:\n{proc.stderr}")
            acc = json.loads(proc.stdout.strip().splitlines()[-1])["test_accuracy"]
            accuracy["pytorch"].append(acc)
            results["pytorch"].append(secs if acc >= TARGET else None)
            print(f"run {run + 1}: trainctl {results['trainctl'][-1] or 'missed'} s "
                  f"(acc {accuracy['trainctl'][-1]:.4f}), PyTorch {results['pytorch'][-1] or 'missed'} s "
                  f"(acc {accuracy['pytorch'][-1]:.4f})", flush=True)
    tm, ts = mlperf(results["trainctl"])
    pm, ps = mlperf(results["pytorch"])
    fmt = lambda m, s: "no run reached the target" if m is None else f"{m:.2f} ± {s:.2f} s"
    print(f"| trainctl ({os.path.basename(a.spec)}) | {fmt(tm, ts)} | accuracy {min(accuracy['trainctl']):.4f}-{max(accuracy['trainctl']):.4f} |")
    precision = a.precision if a.precision != "auto" else ("bf16" if native_bf16() else "fp32")
    torch = subprocess.run([a.python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                           text=True).stdout.strip()
    print(f"| PyTorch {torch}, one process ({a.model} CNN, {precision}{', torch.compile' if a.compile else ''}, "
          f"one-cycle, {a.epochs} epochs, batch {a.batch}) | {fmt(pm, ps)} | accuracy {min(accuracy['pytorch']):.4f}-{max(accuracy['pytorch']):.4f} |")
    if tm and pm:
        print(f"trainctl / PyTorch: {tm / pm:.2f}x (target <= 0.5x)")


if __name__ == "__main__":
    main()
