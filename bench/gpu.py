#!/usr/bin/env python3
"""GPU benchmark for the built-in trainer (issue 3, `device: cuda`): trainctl against PyTorch DDP
(nccl) on the same GPU, the same model, batch and optimizer (SGD, momentum 0.9), side by side in
one run. Needs a trainctl built against a CUDA LibTorch (docs/trainer.md, GPUs) and a python3
with that torch (and torchvision for the ResNets).

Each configuration runs (windows + 1) x window steps; the first window (start-up, cuDNN's
autotuning, allocator warm-up) is dropped and the median samples/s of the others is reported.
trainctl feeds itself from host memory (its prefetch thread and pinned copies); the peer's data is
already on the GPU, the fastest way to feed PyTorch.

With --precision bf16 trainctl runs trainer.precision: bf16 and the peer the same autocast around
its forward pass (the loss in f32).

Usage: bench/gpu.py --trainctl PATH [--python PYTHON] [--configs NAME,...] [--gpus N] [--precision bf16]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

from fashion_mnist import run_peer_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FMNIST = "/usr/share/datasets/fashion-mnist"

# name: (model, data, batch)
CONFIGS = {
    "cnn-fmnist-b64": ("cnn", "fashion-mnist", 64),
    "cnn-fmnist-b512": ("cnn", "fashion-mnist", 512),
    "resnet18-224-b64": ("resnet18", "synthetic:3,224,224", 64),
    "resnet50-224-b64": ("resnet50", "synthetic:3,224,224", 64),
}


def trainctl_run(a, model, data, batch, out):
    if data == "fashion-mnist":
        data_yaml = "{dataset: fashion-mnist}"
    else:
        shape = data.split(":")[1]
        data_yaml = f"{{dataset: synthetic, samples: {batch * 16}, shape: [{shape}], classes: 10}}"
    steps = (a.windows + 1) * a.window
    spec = f"""name: bench-gpu
nodes: 1
procs_per_node: {a.gpus}
output_dir: {out}
trainer:
  model: {model}
  device: cuda
  data: {data_yaml}
  batch_size: {batch}
  max_steps: {steps}
  epochs: 1000
  threads: 4
  precision: {a.precision}
  optimizer: {{name: sgd, lr: 0.01, momentum: 0.9}}
  log_every: {a.window}
  snapshot_every: 0
  eval: false
"""
    path = out + ".yaml"
    with open(path, "w") as f:
        f.write(spec)
    subprocess.run([a.trainctl, "--log-level", "warn", "run", path], check=True,
                   stdout=subprocess.DEVNULL)
    records = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    return [r["samples_per_s"] for r in records if "samples_per_s" in r][1:]


def peer_run(a, model, data, batch):
    lines = run_peer_ranks(
        [a.python, os.path.join(ROOT, "bench", "ddp_gpu.py"), "--model", model, "--data",
         FMNIST if data == "fashion-mnist" else data, "--batch", str(batch),
         "--warmup", str(a.window), "--window", str(a.window), "--windows", str(a.windows)] +
        (["--bf16"] if a.precision == "bf16" else []),
        a.gpus, threads=4)
    return [l["samples_per_s"] for l in lines]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainctl", default=os.path.join(ROOT, "build", "src", "trainctl"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--gpus", type=int, default=1, help="workers, one GPU each")
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="trainer.precision for trainctl; bf16 autocast for the peer")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-gpu-")
    print("| configuration | trainctl samples/s (median) | PyTorch DDP samples/s (median) | trainctl / DDP throughput |")
    print("|---|---|---|---|")
    for name in a.configs.split(","):
        model, data, batch = CONFIGS[name]
        ours = trainctl_run(a, model, data, batch, os.path.join(tmp, name))
        peer = peer_run(a, model, data, batch)
        mo, mp = statistics.median(ours), statistics.median(peer)
        print(f"| {name} | {mo:.0f} ({' '.join('%.0f' % v for v in ours)}) | "
              f"{mp:.0f} ({' '.join('%.0f' % v for v in peer)}) | {mo / mp:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
