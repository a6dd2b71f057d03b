#!/usr/bin/env python3
"""Fashion-MNIST benchmark for the built-in trainer (issue 3), with PyTorch DDP side by side.

All runs use the 2-conv CNN, batch 64 per worker, one compute thread per worker, SGD (lr 0.05,
momentum 0.9), the real Fashion-MNIST from Debian's dataset-fashion-mnist:
  1. trainctl, 1 worker                   -> median epoch time (training only) of --timed-epochs
  2. trainctl, 2 workers                  -> the same; scaling = (2) / (1), target <= 0.55
  3. PyTorch DDP (gloo), 2 workers        -> epoch time; ratio = (2) / (3), target <= 0.5; fed
     two ways: indexing a pre-normalized tensor, and the DataLoader of the PyTorch tutorials
  4. trainctl, 2 workers, 5 epochs        -> test accuracy after 5 epochs, target >= 0.91
Prints a markdown table for bench/RESULTS.md. Usage: bench/fashion_mnist.py [--trainctl PATH]
"""
import argparse, json, os, socket, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = "/usr/bin/python3"  # Debian's, with python3-torch


def trainctl_run(trainctl, workers, epochs, eval_, out):
    spec = f"""name: bench-fm
nodes: 1
procs_per_node: {workers}
output_dir: {out}
trainer:
  model: cnn
  epochs: {epochs}
  batch_size: 64
  threads: 1
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9}}
  log_every: 100
  eval: {str(eval_).lower()}
"""
    path = os.path.join(out + ".yaml")
    with open(path, "w") as f:
        f.write(spec)
    subprocess.run([trainctl, "--log-level", "warn", "run", path], check=True,
                   stdout=subprocess.DEVNULL)
    records = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    epochs_ = [r for r in records if "epoch_seconds" in r]
    acc = [r["test_accuracy"] for r in records if "test_accuracy" in r]
    return epochs_, acc


def run_peer_ranks(argv, workers, threads):
    """Runs `workers` copies of the Python command `argv` with the torchrun environment on this
    host (a free loopback port as MASTER_PORT) and returns the JSON lines rank 0 printed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(workers):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(workers), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=str(threads))
        procs.append(subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, text=True))
    out = procs[0].communicate()[0]
    for p in procs[1:]:
        p.wait()
    if any(p.returncode for p in procs):
        sys.exit(f"the PyTorch peer failed: {' '.join(argv)}")
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]


def ddp_run(workers, epochs, loader):
    return run_peer_ranks([PYTHON, os.path.join(ROOT, "bench", "ddp_fashion_mnist.py"), "--epochs",
                           str(epochs), "--loader", loader], workers, threads=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainctl", default=os.path.join(ROOT, "build", "src", "trainctl"))
    ap.add_argument("--accuracy-epochs", type=int, default=5)
    ap.add_argument("--timed-epochs", type=int, default=3,
                    help="epochs per timing run; the median epoch is reported (shared, noisy "
                         "machines: one slow epoch does not decide)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-fm-")
    n = a.timed_epochs
    one, _ = trainctl_run(a.trainctl, 1, n, False, os.path.join(tmp, "one"))
    two, _ = trainctl_run(a.trainctl, 2, n, False, os.path.join(tmp, "two"))
    ddp = ddp_run(2, n, "tensor")
    ddp_loader = ddp_run(2, n, "dataloader")
    acc_epochs, acc = trainctl_run(a.trainctl, 2, a.accuracy_epochs, True, os.path.join(tmp, "acc"))
    med = lambda runs: statistics.median(r["epoch_seconds"] for r in runs)
    each = lambda runs: " ".join("%.1f" % r["epoch_seconds"] for r in runs)
    t1, t2, td, tl = med(one), med(two), med(ddp), med(ddp_loader)
    print(f"| run | median epoch (s) | epochs (s) | peak RSS per worker (MiB) |")
    print(f"|---|---|---|---|")
    print(f"| trainctl, 1 worker | {t1:.1f} | {each(one)} | {one[-1]['peak_rss_mb']:.0f} |")
    print(f"| trainctl, 2 workers | {t2:.1f} | {each(two)} | {two[-1]['peak_rss_mb']:.0f} |")
    print(f"| PyTorch DDP (gloo), 2 workers, batches by tensor indexing | {td:.1f} | {each(ddp)} | {ddp[-1]['peak_rss_mb']:.0f} |")
    print(f"| PyTorch DDP (gloo), 2 workers, DataLoader + DistributedSampler | {tl:.1f} | {each(ddp_loader)} | {ddp_loader[-1]['peak_rss_mb']:.0f} |")
    print()
    print(f"scaling (2 workers / 1 worker): {t2 / t1:.3f}  (target <= 0.55)")
    print(f"trainctl / PyTorch DDP, 2 workers: {t2 / td:.3f} (tensor indexing), "
          f"{t2 / tl:.3f} (DataLoader)  (target <= 0.5)")
    print("allreduce wait per epoch, trainctl 2 workers (rank 0): " +
          " ".join("%.2f" % r["allreduce_wait_seconds"] for r in two) + " s")
    print(f"test accuracy after {a.accuracy_epochs} epochs, 2 workers: "
          f"{' '.join(f'{x:.4f}' for x in acc)}  (target >= 0.91); "
          f"epoch times {' '.join('%.1f' % r['epoch_seconds'] for r in acc_epochs)} s")
    print(f"PyTorch DDP test accuracy after each of its {n} epochs: " +
          " ".join("%.4f" % r["test_accuracy"] for r in ddp))


if __name__ == "__main__":
    main()
