#!/usr/bin/env python3
"""Fashion-MNIST benchmark for the built-in trainer (issue 3), with PyTorch DDP side by side.

All runs use the 2-conv CNN, batch 64 per worker, one compute thread per worker, SGD (lr 0.05,
momentum 0.9), the real Fashion-MNIST from Debian's dataset-fashion-mnist:
  1. trainctl, 1 worker                   -> epoch time (training only)
  2. trainctl, 2 workers                  -> the same; scaling = (2) / (1), target <= 0.55
  2b. two independent 1-worker trainctl jobs at once, no communication at all: what this machine
     gives two busy cores. 0.5 x (the slower of the two) / (1) is the floor for (2) / (1) that no
     data-parallel trainer can beat here; (2) / (0.5 x the slower) is what synchronizing costs
  3. PyTorch DDP (gloo), 2 workers        -> epoch time; ratio = (2) / (3), target <= 0.5; fed
     two ways: indexing a pre-normalized tensor, and the DataLoader of the PyTorch tutorials;
     and with 1 worker (tensor indexing), for the peer's own scaling on this machine
  4. trainctl, 2 workers, 5 epochs        -> test accuracy after 5 epochs, target >= 0.91
1-3 run one epoch each, in turn, for --rounds rounds: on a shared machine whose speed drifts
(a core slowed for seconds at a time by its neighbours), configurations timed minutes apart
differ by more than what is measured. Each ratio is taken within a round, and the median round
is reported.
--precision bf16 runs trainctl with trainer.precision: bf16 and the peer with bf16 autocast around
its forward pass. Prints a markdown table for bench/RESULTS.md and each run's achieved GFLOP/s per
core (bench/peak_flops gives the CPU's). Usage:
  bench/fashion_mnist.py [--trainctl PATH] [--precision fp32|bf16] [--rounds 5]
"""
import argparse, json, os, socket, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = "/usr/bin/python3"  # Debian's, with python3-torch


PRECISION = "fp32"  # --precision

# The CNN's arithmetic per training sample, counted as a direct convolution would do it (2 FLOP a
# multiply-add; Winograd does fewer): forward, and backward's gradients of the weights and (but
# for the first layer's input) of the inputs.
CONV1 = 2 * 28 * 28 * 32 * 1 * 9
CONV2 = 2 * 14 * 14 * 64 * 32 * 9
FC = 2 * (3136 * 128 + 128 * 10)
FLOP_PER_SAMPLE = 2 * CONV1 + 3 * CONV2 + 3 * FC


def trainctl_start(trainctl, workers, epochs, eval_, out):
    spec = f"""name: bench-fm
nodes: 1
procs_per_node: {workers}
output_dir: {out}
trainer:
  model: cnn
  epochs: {epochs}
  batch_size: 64
  threads: 1
  precision: {PRECISION}
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9}}
  log_every: 100
  eval: {str(eval_).lower()}
"""
    path = os.path.join(out + ".yaml")
    with open(path, "w") as f:
        f.write(spec)
    return subprocess.Popen([trainctl, "--log-level", "warn", "run", path],
                            stdout=subprocess.DEVNULL)


def trainctl_results(proc, out):
    if proc.wait() != 0:
        sys.exit(f"trainctl failed ({proc.returncode}); its logs are in {out}/logs")
    records = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    epochs_ = [r for r in records if "epoch_seconds" in r]
    acc = [r["test_accuracy"] for r in records if "test_accuracy" in r]
    return epochs_, acc


def trainctl_run(trainctl, workers, epochs, eval_, out):
    return trainctl_results(trainctl_start(trainctl, workers, epochs, eval_, out), out)


def trainctl_pair(trainctl, out):
    """Two 1-worker jobs started at once; the epoch records of the slower one. When the faster
    ends first, the slower runs its last steps alone, so this understates the floor a little."""
    outs = [out + "a", out + "b"]
    procs = [trainctl_start(trainctl, 1, 1, False, o) for o in outs]
    return max((trainctl_results(p, o)[0] for p, o in zip(procs, outs)),
               key=lambda epochs: epochs[0]["epoch_seconds"])


def cpu_share(index, count):
    """Share `index` of `count` of this process's CPUs, as trainctl's cpu_bind: cores gives a
    node's tasks (common/cpus.h, CpuShare): consecutive runs, the larger first; with fewer CPUs
    than shares, one CPU each in turn."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < count:
        return {cpus[index % len(cpus)]}
    start = lambda i: (i * len(cpus) + count - 1) // count
    return set(cpus[start(index):start(index + 1)])


def run_peer_ranks(argv, workers, threads, bind=False):
    """Runs `workers` copies of the Python command `argv` with the torchrun environment on this
    host (a free loopback port as MASTER_PORT) and returns the JSON lines rank 0 printed. With
    `bind`, each rank on its own share of the CPUs (cpu_share), as trainctl's cpu_bind: cores."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(workers):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(workers), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=str(threads))
        cpus = cpu_share(rank, workers) if bind else None
        procs.append(subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, text=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if bind else None))
    out = procs[0].communicate()[0]
    for p in procs[1:]:
        p.wait()
    if any(p.returncode for p in procs):
        sys.exit(f"the PyTorch peer failed: {' '.join(argv)}")
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def ddp_run(workers, epochs, loader):
    return run_peer_ranks([PYTHON, os.path.join(ROOT, "bench", "ddp_fashion_mnist.py"), "--epochs",
                           str(epochs), "--loader", loader] + (["--bf16"] if PRECISION == "bf16" else []),
                          workers, threads=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainctl", default=os.path.join(ROOT, "build", "src", "trainctl"))
    ap.add_argument("--accuracy-epochs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds of one epoch per configuration; medians are reported")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="trainer.precision for trainctl; bf16 autocast for the PyTorch peer")
    a = ap.parse_args()
    global PRECISION
    PRECISION = a.precision
    tmp = tempfile.mkdtemp(prefix="bench-fm-")
    runs = {"one": [], "two": [], "pair": [], "ddp1": [], "ddp": [], "ddp_loader": []}
    for r in range(a.rounds):
        runs["one"] += trainctl_run(a.trainctl, 1, 1, False, os.path.join(tmp, f"one{r}"))[0]
        runs["two"] += trainctl_run(a.trainctl, 2, 1, False, os.path.join(tmp, f"two{r}"))[0]
        runs["pair"] += trainctl_pair(a.trainctl, os.path.join(tmp, f"pair{r}"))
        runs["ddp1"] += ddp_run(1, 1, "tensor")
        runs["ddp"] += ddp_run(2, 1, "tensor")
        runs["ddp_loader"] += ddp_run(2, 1, "dataloader")
    acc_epochs, acc = trainctl_run(a.trainctl, 2, a.accuracy_epochs, True, os.path.join(tmp, "acc"))
    secs = {k: [r["epoch_seconds"] for r in v] for k, v in runs.items()}
    med = lambda k: statistics.median(secs[k])
    each = lambda k: " ".join("%.1f" % x for x in secs[k])
    secs["half_pair"] = [x / 2 for x in secs["pair"]]
    ratios = lambda a_, b_: [x / y for x, y in zip(secs[a_], secs[b_])]
    fmt = lambda v: " ".join("%.3f" % x for x in v)
    rss = lambda k: max(r["peak_rss_mb"] for r in runs[k])
    print(f"| run | median epoch (s) | epochs, round by round (s) | peak RSS per worker (MiB) |")
    print(f"|---|---|---|---|")
    print(f"| trainctl, 1 worker | {med('one'):.1f} | {each('one')} | {rss('one'):.0f} |")
    print(f"| trainctl, 2 workers | {med('two'):.1f} | {each('two')} | {rss('two'):.0f} |")
    print(f"| trainctl, two 1-worker jobs at once (the slower) | {med('pair'):.1f} | {each('pair')} | {rss('pair'):.0f} |")
    print(f"| PyTorch DDP (gloo), 1 worker, batches by tensor indexing | {med('ddp1'):.1f} | {each('ddp1')} | {rss('ddp1'):.0f} |")
    print(f"| PyTorch DDP (gloo), 2 workers, batches by tensor indexing | {med('ddp'):.1f} | {each('ddp')} | {rss('ddp'):.0f} |")
    print(f"| PyTorch DDP (gloo), 2 workers, DataLoader + DistributedSampler | {med('ddp_loader'):.1f} | {each('ddp_loader')} | {rss('ddp_loader'):.0f} |")
    print()
    for name, (x, y), target in [
            ("scaling (2 workers / 1 worker)", ("two", "one"), "target <= 0.55"),
            ("the machine's floor for it (0.5 x two jobs at once / 1 worker)", ("half_pair", "one"),
             "no communication at all"),
            ("2 workers / (0.5 x two jobs at once)", ("two", "half_pair"), "what synchronizing costs"),
            ("PyTorch DDP's own scaling (2 workers / 1 worker)", ("ddp", "ddp1"), "the peer"),
            ("trainctl / PyTorch DDP (tensor indexing)", ("two", "ddp"), "target <= 0.5"),
            ("trainctl / PyTorch DDP (DataLoader)", ("two", "ddp_loader"), "target <= 0.5")]:
        v = ratios(x, y)
        print(f"{name}: median {statistics.median(v):.3f}, rounds {fmt(v)}  ({target})")
    # Per core: every worker has one compute thread and one core.
    for name, key, workers in [("trainctl, 1 worker", "one", 1), ("trainctl, 2 workers", "two", 2),
                               ("PyTorch DDP, 1 worker", "ddp1", 1), ("PyTorch DDP, 2 workers", "ddp", 2)]:
        print(f"achieved arithmetic, {name} ({PRECISION}): "
              f"{FLOP_PER_SAMPLE * 60000 / med(key) / workers / 1e9:.1f} GFLOP/s per core "
              f"({FLOP_PER_SAMPLE / 1e6:.2f} MFLOP per sample, direct-convolution count)")
    print("allreduce wait per epoch, trainctl 2 workers (rank 0): " +
          " ".join("%.2f" % r["allreduce_wait_seconds"] for r in runs["two"]) + " s")
    print(f"test accuracy after {a.accuracy_epochs} epochs, 2 workers: "
          f"{' '.join(f'{x:.4f}' for x in acc)}  (target >= 0.91); "
          f"epoch times {' '.join('%.1f' % r['epoch_seconds'] for r in acc_epochs)} s")
    print(f"PyTorch DDP test accuracy after its one epoch, round by round: " +
          " ".join("%.4f" % r["test_accuracy"] for r in runs["ddp"]))

if __name__ == "__main__":
    main()
