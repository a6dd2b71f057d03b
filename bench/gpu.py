#!/usr/bin/env python3
"""GPU benchmark for the built-in trainer (issue 3, `device: cuda`): trainctl against PyTorch DDP
(nccl) on the same GPU, the same model, batch and optimizer (SGD, momentum 0.9), side by side in
one run. Needs a trainctl built against a CUDA LibTorch (docs/trainer.md, GPUs) and a python3
with that torch (and torchvision for the ResNets).

Each configuration runs (windows + 1) x window steps (trainctl checkpoints once, after the last
window; the peer not at all); the first window (start-up, cuDNN's
autotuning, allocator warm-up) is dropped and the median samples/s of the others is reported.
trainctl feeds itself from host memory (its prefetch thread and pinned copies); the peer's data is
already on the GPU, the fastest way to feed PyTorch.

With --precision bf16 trainctl runs trainer.precision: bf16 and the peer the same autocast around
its forward pass (the loss in f32). --layout tuned runs both sides channels-last with cuDNN's
benchmark mode (trainer.memory_format / cudnn_benchmark; the peer's --channels-last
--cudnn-benchmark); plain (the default) neither.

Usage: bench/gpu.py --trainctl PATH [--python PYTHON] [--configs NAME,...] [--gpus N]
                    [--precision bf16] [--layout plain|tuned]
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


def trainctl_start(trainctl, out, model, data, batch, workers, device, threads, window, windows,
                   precision="fp32", extra="", cpus=None):
    """Starts `trainctl run` of (windows + 1) x window steps; trainctl_rates() reads its result.
    `cpus`: the only CPUs the job (launcher, agent, workers) may run on."""
    if data == "fashion-mnist":
        data_yaml = "{dataset: fashion-mnist}"
    else:
        shape = data.split(":")[1]
        # 64 batches an epoch: at each epoch's start the GPU waits for the first batch.
        data_yaml = f"{{dataset: synthetic, samples: {batch * 64}, shape: [{shape}], classes: 10}}"
    spec = f"""name: bench-{device}
nodes: 1
procs_per_node: {workers}
output_dir: {out}
trainer:
  model: {model}
  device: {device}
  data: {data_yaml}
  batch_size: {batch}
  max_steps: {(windows + 1) * window}
  checkpoint_every: {(windows + 1) * window}
  epochs: 1000
  threads: {threads}
  precision: {precision}
  optimizer: {{name: sgd, lr: 0.01, momentum: 0.9}}
  log_every: {window}
  snapshot_every: 0
  eval: false
{extra}"""
    path = out + ".yaml"
    with open(path, "w") as f:
        f.write(spec)
    return subprocess.Popen([trainctl, "--log-level", "warn", "run", path], stdout=subprocess.DEVNULL,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)


def trainctl_windows(proc, out):
    """The job's metrics lines of each log window but the first (start-up)."""
    if proc.wait() != 0:
        sys.exit(f"trainctl failed ({proc.returncode}); its logs are in {out}/logs")
    records = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    return [r for r in records if "samples_per_s" in r][1:]


def trainctl_rates(proc, out):
    """The job's samples/s in each window but the first (start-up)."""
    return [r["samples_per_s"] for r in trainctl_windows(proc, out)]


def peer_rates(python, model, data, batch, workers, device, threads, window, windows,
               precision="fp32", flags=(), bind=False):
    """PyTorch DDP (bench/ddp_gpu.py) on the same terms; samples/s per window after a warm-up."""
    lines = run_peer_ranks(
        [python, os.path.join(ROOT, "bench", "ddp_gpu.py"), "--device", device, "--model", model,
         "--data", FMNIST if data == "fashion-mnist" else data, "--batch", str(batch),
         "--warmup", str(window), "--window", str(window), "--windows", str(windows)] +
        (["--bf16"] if precision == "bf16" else []) + list(flags),
        workers, threads=threads, bind=bind)
    return [l["samples_per_s"] for l in lines]


# --layout: (trainctl's spec lines, the peer's flags)
LAYOUTS = {
    "tuned": ("  memory_format: channels_last\n  cudnn_benchmark: true\n", ("--channels-last", "--cudnn-benchmark")),
    "plain": ("  memory_format: contiguous\n  cudnn_benchmark: false\n", ()),
}


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
    ap.add_argument("--layout", choices=list(LAYOUTS), default="plain",
                    help="the same on both sides: tuned (channels-last, cuDNN benchmark) or plain")
    a = ap.parse_args()
    extra, flags = LAYOUTS[a.layout]
    tmp = tempfile.mkdtemp(prefix="bench-gpu-")
    print("| configuration | trainctl samples/s (median) | PyTorch DDP samples/s (median) | trainctl / DDP throughput |")
    print("|---|---|---|---|")
    for name in a.configs.split(","):
        model, data, batch = CONFIGS[name]
        out = os.path.join(tmp, name)
        ours = trainctl_rates(trainctl_start(a.trainctl, out, model, data, batch, a.gpus, "cuda", 4,
                                             a.window, a.windows, a.precision, extra), out)
        peer = peer_rates(a.python, model, data, batch, a.gpus, "cuda", 4, a.window, a.windows,
                          a.precision, flags)
        mo, mp = statistics.median(ours), statistics.median(peer)
        print(f"| {name} | {mo:.0f} ({' '.join('%.0f' % v for v in ours)}) | "
              f"{mp:.0f} ({' '.join('%.0f' % v for v in peer)}) | {mo / mp:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
