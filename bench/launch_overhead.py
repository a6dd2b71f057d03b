#!/usr/bin/env python3
"""Launch overhead: from `trainctl run` to every worker started, against starting the same
processes directly (the peer baseline), measured side by side in one run.

Each worker is `sh -c 'date +%s%N > $STAMP_DIR/t-$RANK'`: it records the wall-clock time at which
it started. A sample is (latest worker start) - (time the launch began). trainctl's overhead is
the difference of the medians. Result checking (all stamps present) is separate from timing.

Usage: bench/launch_overhead.py [--trainctl build/src/trainctl] [--runs 30] [--workers 4]
"""
import argparse
import os
import statistics
import subprocess
import tempfile
import time

WORKER = 'date +%s%N > "$STAMP_DIR/t-$RANK"'


def latest_start(stamp_dir, workers):
    stamps = []
    for rank in range(workers):
        with open(os.path.join(stamp_dir, f"t-{rank}")) as f:
            stamps.append(int(f.read()))
    return max(stamps)


def direct(stamp_dir, workers):
    """The baseline: the same worker processes started directly."""
    t0 = time.time_ns()
    procs = []
    for rank in range(workers):
        env = dict(os.environ, RANK=str(rank), STAMP_DIR=stamp_dir)
        procs.append(subprocess.Popen(["sh", "-c", WORKER], env=env))
    for p in procs:
        assert p.wait() == 0
    return latest_start(stamp_dir, workers) - t0


def trainctl(binary, spec, stamp_dir, workers):
    t0 = time.time_ns()
    r = subprocess.run([binary, "--log-level", "warn", "run", spec,
                        "--set", f"env.STAMP_DIR={stamp_dir}"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr.decode()
    return latest_start(stamp_dir, workers) - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainctl", default="build/src/trainctl")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec = os.path.join(tmp, "job.yaml")
        with open(spec, "w") as f:
            f.write(f"name: launch-bench\nprocs_per_node: {args.workers}\n"
                    f"command: [sh, -c, '{WORKER}']\nrestart: {{max_restarts: 0}}\n"
                    f"output_dir: {tmp}/out\n")
        base, ours = [], []
        for i in range(args.runs):  # interleaved, so both see the same machine noise
            for kind, samples in (("direct", base), ("trainctl", ours)):
                d = os.path.join(tmp, f"{kind}-{i}")
                os.mkdir(d)
                if kind == "direct":
                    samples.append(direct(d, args.workers) / 1e6)
                else:
                    samples.append(trainctl(args.trainctl, spec, d, args.workers) / 1e6)

    def row(name, xs):
        xs = sorted(xs)
        p90 = xs[int(0.9 * (len(xs) - 1))]
        return f"| {name} | {statistics.median(xs):.1f} | {p90:.1f} | {xs[0]:.1f} |"

    print(f"launch to all {args.workers} workers started, {args.runs} runs each, milliseconds")
    print("| launcher | median | p90 | min |")
    print("|---|---|---|---|")
    print(row("direct (baseline)", base))
    print(row("trainctl run", ours))
    overhead = statistics.median(ours) - statistics.median(base)
    print(f"\noverhead (median trainctl - median direct): {overhead:.1f} ms (target < 100 ms); "
          f"ratio {statistics.median(ours) / statistics.median(base):.2f}x")


if __name__ == "__main__":
    main()
