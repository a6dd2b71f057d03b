#!/usr/bin/env python3
"""A no-op local job of many nodes (issue 25, part 3): `trainctl run` of `nodes: N` with
`command: ["true"]` (one agent process per node, each starting `true`), from start to exit.

Each run is in a new directory (its output under DIR/runs, as a user's first run there; all are
removed at the end, none between runs, whose thousands of freed inodes slow the next run's file
creation on ext4 by a third); when
several trainctl builds are given they alternate run by run, so that a noisy machine slows them
alike. Reports each build's wall times, the median, and the median CPU time of the whole job
(launcher, agents, tasks: the children's rusage). A run that fails is reported with its exit code.

Usage: bench/wide_job.py [--nodes 1024] [--runs 5] [--dir /tmp] TRAINCTL [TRAINCTL...]
"""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the runs' directories are made")
    ap.add_argument("trainctl", nargs="+", help="trainctl binaries to compare")
    a = ap.parse_args()
    work = tempfile.mkdtemp(dir=a.dir, prefix="wide-job-")
    spec = os.path.join(work, "wide.yaml")
    with open(spec, "w") as f:
        f.write(f'name: wide\nnodes: {a.nodes}\ncommand: ["true"]\n')
    results = {b: [] for b in a.trainctl}
    try:
        for i in range(a.runs):
            for b in a.trainctl:
                run_dir = tempfile.mkdtemp(dir=work, prefix="run-")
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                start = time.monotonic()
                rc = subprocess.run([os.path.abspath(b), "run", spec], cwd=run_dir, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL).returncode
                wall = time.monotonic() - start
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                results[b].append((wall, cpu, rc))
    finally:  # not between runs: ext4 then searches its recently freed inodes on every create
        shutil.rmtree(work, ignore_errors=True)
    print(f"{a.nodes} nodes, {a.runs} runs each")
    for b, runs in results.items():
        walls = " ".join(f"{w:.2f}" + ("" if rc == 0 else f" (exit {rc})") for w, _, rc in runs)
        print(f"{b}: wall {statistics.median(r[0] for r in runs):.2f} s median (runs: {walls}), "
              f"CPU {statistics.median(r[1] for r in runs):.2f} s median")


if __name__ == "__main__":
    main()
