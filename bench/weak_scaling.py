#!/usr/bin/env python3
"""Weak scaling of the built-in trainer on the CPU (issue 25, part 4), PyTorch DDP side by side.

The example CNN on Fashion-MNIST, batch 64 per worker, one compute thread per worker, N workers on
this machine for each N of --workers. Every configuration runs (windows + 1) x window steps; the
first window (start-up) is dropped and the median samples/s of the others is its throughput.

  efficiency(N) = throughput(N workers) / (N x throughput(1 worker)), target >= 0.9 at 16

Beside it in the same run:
  - N independent 1-worker trainctl jobs at once: what this machine gives N busy cores with no
    communication at all (shared caches, memory bandwidth, clock, hyper-threads). No data-parallel
    trainer can beat it: trainctl / this floor is what synchronizing costs.
  - PyTorch DDP (gloo) with the same model, batch and threads (bench/ddp_gpu.py --device cpu, the
    data already in memory), its own efficiency the same way.
  - "waiting": the share of trainctl's training time rank 0 spent waiting for the other ranks'
    gradients (metrics.jsonl's comm_seconds / window_seconds): the ranks' steps drifting apart.
  - "slowest rank": the rank named slowest (the one that waited least) in the most windows, and
    in how many of them: one rank again and again is a straggler (its core, its data); the name
    moving from window to window is noise that hits every rank alike.
  - the timeline of the second window of every trainctl run of several workers (bench/timeline.py):
    how far behind the first rank the last one reached each step's gradient average, and in which
    phase it lost the time (a late start, data, forward, backward), and which ranks were last.
  - "steal": the share of the machine's CPU time its hypervisor gave to other guests during the
    runs (/proc/stat): on a shared VM, a rank that loses its core for a moment stalls them all.

A shared VM's cores change speed from minute to minute (one core's rate varied by a third within
one run on the lent device), so with --rounds R each N runs trainctl and the independent jobs R
times, alternating, and reports medians; the 1-worker job is re-run in every round as the base.

With --balance every round also runs trainctl with `balance: speed` (the global batch split by the
workers' measured speed), in its own columns.

With --bind every worker runs on a core of its own: trainctl's jobs with `cpu_bind: cores`, each
independent job on its own core (the same share), the peer's ranks pinned the same way.

Usage: bench/weak_scaling.py [--trainctl PATH] [--python PYTHON] [--workers 1,2,4,8,16] [--rounds R]
                            [--bind] [--balance] [--keep DIR]
"""
import argparse, os, resource, shutil, statistics, subprocess, tempfile

from fashion_mnist import PYTHON, cpu_share
from gpu import ROOT, peer_rates, trainctl_rates, trainctl_start, trainctl_windows
import timeline


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainctl", default=os.path.join(ROOT, "build", "src", "trainctl"))
    ap.add_argument("--python", default=PYTHON, help="a python3 with torch (default: Debian's)")
    ap.add_argument("--workers", default="1,2,4,8,16")
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--no-peer", action="store_true", help="trainctl only")
    ap.add_argument("--rounds", type=int, default=1, help="alternating runs of each configuration")
    ap.add_argument("--bind", action="store_true", help="each worker on a core of its own (cpu_bind: cores)")
    ap.add_argument("--keep", metavar="DIR", help="copy every multi-worker run's timeline.json here")
    ap.add_argument("--balance", action="store_true",
                    help="also trainctl with balance: speed in every round, side by side")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-weak-")
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    for line in cpu.splitlines():
        if line.split(":")[0] in ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket",
                                  "Socket(s)", "L3"):
            print("#", line)
    args = dict(model="cnn", data="fashion-mnist", batch=64, device="cpu", threads=1,
                window=a.window, windows=a.windows)
    print("# workers bound to cores (trainctl: cpu_bind: cores; the others pinned the same)" if a.bind
          else "# workers not bound to cores (cpu_bind: none)")
    bound = "cpu_bind: cores\n" if a.bind else ""

    steps = (a.windows + 1) * a.window
    # (kind, n): [(involuntary, voluntary) context switches per worker per 100 steps, steal share]
    switches = {}

    def count_switches(kind, n, run):
        """run(), the context switches of every process it started and waited for, and the share
        of the machine's CPU time its hypervisor gave to other guests meanwhile (steal)."""
        before, cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_times()
        result = run()
        after, cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_times()
        per = 100 / (n * steps)
        total = sum(cpu_after) - sum(cpu_before)
        switches.setdefault((kind, n), []).append(((after.ru_nivcsw - before.ru_nivcsw) * per,
                                                   (after.ru_nvcsw - before.ru_nvcsw) * per,
                                                   (cpu_after[7] - cpu_before[7]) / total if total else 0))
        return result

    timelines = []  # (n, balance, the run's timeline summary)

    def ours(n, name, balance="even"):
        out = os.path.join(tmp, name)
        # The second window's steps in a timeline (bench/timeline.py): which rank was last, where.
        record = f"  timeline_steps: {min(a.window, 1000)}\n  balance: {balance}\n" if n > 1 else ""
        windows = count_switches("trainctl", n, lambda: trainctl_windows(
            trainctl_start(a.trainctl, out, workers=n, extra=record + bound, **args), out))
        if n > 1:
            timelines.append((n, balance, timeline.summary(os.path.join(out, "timeline.json"))))
            if a.keep:
                os.makedirs(a.keep, exist_ok=True)
                shutil.copy(os.path.join(out, "timeline.json"), os.path.join(a.keep, f"{name}-{balance}.json"))
        wait = sum(w["comm_seconds"] for w in windows) / sum(w["window_seconds"] for w in windows)
        named = [int(w["slowest_rank"]) for w in windows if "slowest_rank" in w]
        slowest = max(set(named), key=named.count) if named else None
        slowest = f"{slowest} ({named.count(slowest)} of {len(named)})" if named else "-"
        return statistics.median(w["samples_per_s"] for w in windows), wait, slowest

    def independent(n, name):
        outs = [os.path.join(tmp, f"{name}-{k}") for k in range(n)]
        return count_switches("independent", n, lambda: sum(
            statistics.median(trainctl_rates(p, o))
            for p, o in zip([trainctl_start(a.trainctl, o, workers=1, cpus=cpu_share(k, n) if a.bind else None,
                                            **args) for k, o in enumerate(outs)], outs)))

    print("| workers | trainctl samples/s | trainctl efficiency | waiting | slowest rank | N independent 1-worker jobs, "
          "samples/s together | their efficiency (the machine's floor) | trainctl / independent jobs "
          "| PyTorch DDP samples/s | DDP efficiency | trainctl / DDP throughput |"
          + (" trainctl, balance: speed, samples/s | its efficiency | its waiting | / independent jobs |"
             if a.balance else ""))
    print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|---|" if a.balance else ""))
    peer_base = None
    for n in [int(v) for v in a.workers.split(",")]:
        one, many, solo, balanced = [], [], [], []
        for r in range(a.rounds):
            if n > 1:  # the base, in the same rounds
                one.append(ours(1, f"w1-{n}-{r}")[0])
            many.append(ours(n, f"w{n}-{r}"))
            if a.balance and n > 1:
                balanced.append(ours(n, f"w{n}s-{r}", balance="speed"))
            solo.append(independent(n, f"solo{n}-{r}"))
        base = statistics.median(one or [rate for rate, _, _ in many])
        rate, efficiency, wait, ratio = figures(many, solo, n, base)
        slowest = ", ".join(s for _, _, s in many)
        floor = statistics.median(solo)
        peer = None if a.no_peer else statistics.median(peer_rates(a.python, workers=n, bind=a.bind, **args))
        if peer and peer_base is None:
            peer_base = peer
        speed = " - | - | - | - |" if a.balance else ""
        if balanced:
            b_rate, b_efficiency, b_wait, b_ratio = figures(balanced, solo, n, base)
            speed = f" {b_rate:.0f} | {b_efficiency:.3f} | {100 * b_wait:.1f} % | {b_ratio:.3f} |"
        print(f"| {n} | {rate:.0f} | {efficiency:.3f} | {100 * wait:.1f} % | {slowest} | {floor:.0f} | "
              f"{floor / (n * base):.3f} | {ratio:.3f} | "
              + (f"{peer:.0f} | {peer / (n * peer_base):.3f} | {rate / peer:.2f}x |" if peer else "- | - | - |")
              + speed, flush=True)
    # Whether the ranks' steps drift apart for the scheduler's sake: a worker preempted (an
    # involuntary switch) stalls every rank of a synchronous job, one independent job only.
    # Steal: time the hypervisor ran other guests on this VM's CPUs; the ranks it hits stall the
    # synchronous job, where independent jobs lose only their own share.
    print("\n| workers | context switches per worker per 100 steps: trainctl, involuntary | voluntary "
          "| N independent jobs, involuntary | voluntary | steal during trainctl's runs | during the "
          "independent jobs' |")
    print("|---|---|---|---|---|---|---|")
    for n in sorted({n for _, n in switches}):
        med = lambda kind, k: statistics.median(v[k] for v in switches.get((kind, n), [(0, 0, 0)]))
        print(f"| {n} | {med('trainctl', 0):.1f} | {med('trainctl', 1):.1f} | {med('independent', 0):.1f} "
              f"| {med('independent', 1):.1f} | {100 * med('trainctl', 2):.2f} % | "
              f"{100 * med('independent', 2):.2f} % |")


    # Each step's last rank to reach the gradient average, from the runs' timelines.
    for n, balance, s in timelines:
        print(f"\ntimeline, {n} workers, balance: {balance}: {timeline.describe(s)}")


def figures(runs, solo, n, base):
    """Of one configuration's rounds (samples/s, rank 0's waiting, slowest rank) beside the same
    rounds' independent jobs: the median samples/s, its efficiency against `base` samples/s for
    one worker, the median waiting, and the median ratio to the independent jobs."""
    rate = statistics.median(v for v, _, _ in runs)
    return (rate, rate / (n * base), statistics.median(w for _, w, _ in runs),
            statistics.median(m[0] / s for m, s in zip(runs, solo)))


def cpu_times():
    """The machine's CPU time so far, /proc/stat's first line: user, nice, system, idle, iowait,
    irq, softirq, steal (guest time is counted in user already)."""
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:9]]


if __name__ == "__main__":
    main()
