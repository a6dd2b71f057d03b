#!/usr/bin/env python3
"""trainctl torchrun against Debian's torchrun (python3-torch), side by side in one run (issue 23):
the same DDP worker (bench/torchrun_worker.py, 2 workers, gloo) under each launcher.

- start-up: from starting the launcher to the worker's first line (printed before it imports torch);
- recovery: a worker is SIGKILLed while training; from the kill to the restarted group's first step.
  KILLS kills per launcher, in one job each (max restarts = KILLS).

Both run with their defaults otherwise (torchrun's --monitor_interval is 5 s in torch 1.13).
Usage: bench/torchrun.py [--kills 10] [--trainctl build/src/trainctl]
"""
import argparse
import os
import queue
import re
import signal
import statistics
import subprocess
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "bench", "torchrun_worker.py")


def launch(argv, env):
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put((time.time(), l)) for l in proc.stdout], daemon=True).start()
    return proc, lines


RANK1 = {}  # restart count -> pid of rank 1, from every line that went by


def wait_for(lines, pattern, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            t, line = lines.get(timeout=deadline - time.time())
        except queue.Empty:
            break
        started = re.search(r"started [0-9.]+ pid (\d+) rank 1 restart (\d+)", line)
        if started:
            RANK1[int(started.group(2))] = int(started.group(1))
        m = re.search(pattern, line)
        if m:
            return t, m
    raise RuntimeError("timed out waiting for " + pattern)


def measure(name, argv, kills):
    env = dict(os.environ, PATH="/usr/bin:/bin:" + os.environ.get("PATH", ""))
    RANK1.clear()
    t0 = time.time()
    proc, lines = launch(argv, env)
    _, m = wait_for(lines, r"started ([0-9.]+) pid (\d+) rank 0 restart 0")
    startup = float(m.group(1)) - t0
    recoveries = []
    for k in range(kills):
        # A worker (rank 1) of the running group, killed once the group trains.
        wait_for(lines, r"step 5 restart %d " % k)
        victim = RANK1[k]
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        _, m = wait_for(lines, r"step 0 restart %d ([0-9.]+)" % (k + 1))
        recoveries.append(float(m.group(1)) - killed)
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)
    print("%-18s start-up %.3f s; recovery median %.3f s, min %.3f, max %.3f (%d kills)"
          % (name, startup, statistics.median(recoveries), min(recoveries), max(recoveries), kills))
    return startup, statistics.median(recoveries)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--trainctl", default=os.path.join(ROOT, "build/src/trainctl"))
    args = ap.parse_args()
    k = str(args.kills)
    torchrun = measure("torchrun (Debian)", ["/usr/bin/python3", "-m", "torch.distributed.run", "--standalone",
                                             "--nproc_per_node", "2", "--max_restarts", k, "--redirects", "1",
                                             "--tee", "1", WORKER], args.kills)
    ours = measure("trainctl torchrun", [args.trainctl, "torchrun", "--standalone", "--nproc_per_node", "2",
                                         "--max_restarts", k, "--redirects", "1", "--tee", "1", WORKER], args.kills)
    print("ratio trainctl / torchrun: start-up %.3f, recovery %.3f" % (ours[0] / torchrun[0], ours[1] / torchrun[1]))


if __name__ == "__main__":
    main()
