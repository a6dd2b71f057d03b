#!/usr/bin/env python3
"""A no-op local job of many nodes (issue 25, part 3): `trainctl run` of `nodes: N` with
`command: ["true"]` (one agent process per node, each starting `true`), from start to exit.

Each run is in a new directory (its output under DIR/runs, as a user's first run there; all are
removed at the end, none between runs, whose thousands of freed inodes slow the next run's file
creation on ext4 by a third); when
several trainctl builds are given they alternate run by run, so that a noisy machine slows them
alike. Reports each build's wall times, the median, and the median CPU time of the whole job
(launcher, agents, tasks: the children's rusage). A run that fails is reported with its exit code.

The machine's floor is timed beside each run (issue 64): bench/process_floor.c, compiled here
with cc, forks and execs 2 x N `true` processes (the job's N agents and N tasks, had each been
exec'd), all at once; the ratio of each build's median to the floor's median is printed.

Usage: bench/wide_job.py [--nodes 1024] [--runs 5] [--dir /tmp] [--max-tasks N] TRAINCTL [TRAINCTL...]
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
    ap.add_argument("--max-tasks", type=int, default=0, help="trainctl run --max-tasks (more than 64 per CPU)")
    ap.add_argument("trainctl", nargs="+", help="trainctl binaries to compare")
    a = ap.parse_args()
    work = tempfile.mkdtemp(dir=a.dir, prefix="wide-job-")
    floor_exe = os.path.join(work, "process_floor")
    subprocess.run(["cc", "-O2", "-o", floor_exe, os.path.join(os.path.dirname(os.path.abspath(__file__)), "process_floor.c")],
                   check=True)
    floors = []
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
                extra = ["--max-tasks", str(a.max_tasks)] if a.max_tasks else []
                rc = subprocess.run([os.path.abspath(b), "run", spec] + extra, cwd=run_dir, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL).returncode
                wall = time.monotonic() - start
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                results[b].append((wall, cpu, rc))
                floors.append(float(subprocess.run([floor_exe, str(2 * a.nodes)], capture_output=True, text=True,
                                                   check=True).stdout))
    finally:  # not between runs: ext4 then searches its recently freed inodes on every create
        shutil.rmtree(work, ignore_errors=True)
    floor = statistics.median(floors)
    print(f"{a.nodes} nodes, {a.runs} runs each; the floor (fork and exec {2 * a.nodes} true): {floor:.2f} s median "
          f"(runs: {' '.join(f'{f:.2f}' for f in floors)})")
    for b, runs in results.items():
        walls = " ".join(f"{w:.2f}" + ("" if rc == 0 else f" (exit {rc})") for w, _, rc in runs)
        wall = statistics.median(r[0] for r in runs)
        print(f"{b}: wall {wall:.2f} s median (runs: {walls}), CPU {statistics.median(r[1] for r in runs):.2f} s "
              f"median; {wall / floor:.2f}x the floor")


if __name__ == "__main__":
    main()
