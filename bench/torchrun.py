#!/usr/bin/env python3
"""trainctl torchrun against PyTorch's own torchrun, side by side in one run (issues 23, 53, 74):
the same DDP worker (bench/torchrun_worker.py, gloo) under each launcher, on the same torch:
Debian's python3-torch (1.13), or with --python that of `scripts/dev pytorch-env` (today's).

recovery (the default): 2 workers; a worker is SIGKILLed while training; from the kill to the first
  step of the next group that trains (a restarted group that fails to start, as torch 2.x's
  torchrun's sometimes do in gloo's connectFullMesh, is counted and waited through). KILLS kills
  per launcher, in one job each (max restarts = 3 x KILLS).
  Also start-up: from starting the launcher to the worker's first line (before it imports torch).
startup: from starting the launcher to every rank's first training step, for 2 and 8 workers, and
  the memory (PSS, summed over the launcher's processes) once every rank has stepped.

Launchers: torchrun with --monitor_interval MI (default 0.1 s: torchrun polls its workers every MI
seconds, 5 s by default in torch 1.13, 0.1 s in 2.x), trainctl torchrun, and trainctl torchrun
--preload torch (workers forked from a warm interpreter, docs/own-program.md).
Usage: bench/torchrun.py [recovery|startup] [--kills 10] [--monitor-interval 0.1] [--python PATH]
                         [--trainctl PATH]
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


def wait_for(lines, pattern, timeout=180):
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


def environment():
    return dict(os.environ, PATH="/usr/bin:/bin:" + os.environ.get("PATH", ""))


def stop(proc):
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)


def session_pss(sid):
    """PSS in MiB of every process of session `sid` (the launcher started one)."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getsid(int(pid)) != sid:
                continue
            with open("/proc/%s/smaps_rollup" % pid) as f:
                total += sum(int(l.split()[1]) for l in f if l.startswith("Pss:"))
        except OSError:
            pass
    return total / 1024


def recovery(name, argv, kills):
    RANK1.clear()
    t0 = time.time()
    proc, lines = launch(argv, environment())
    _, m = wait_for(lines, r"started ([0-9.]+) pid (\d+) rank 0 restart 0")
    startup = float(m.group(1)) - t0
    recoveries = []
    restart = failed = 0
    hung = ""
    for k in range(kills):
        # A worker (rank 1) of the running group, killed once the group trains.
        wait_for(lines, r"step 5 restart %d " % restart)
        victim = RANK1[restart]
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        try:
            _, m = wait_for(lines, r"step 0 restart (\d+) ([0-9.]+)")
        except RuntimeError:  # no group trains again: the job is stopped, and said so
            hung = "; kill %d: no group trained again within 180 s" % (k + 1)
            break
        failed += int(m.group(1)) - restart - 1
        restart = int(m.group(1))
        recoveries.append(float(m.group(2)) - killed)
    stop(proc)
    if not recoveries:
        print("%-32s start-up %.3f s; no recovery%s" % (name, startup, hung), flush=True)
        return startup, float("nan")
    print("%-32s start-up %.3f s; recovery median %.3f s, min %.3f, max %.3f (%d kills; %d restarted groups "
          "failed to start%s)" % (name, startup, statistics.median(recoveries), min(recoveries), max(recoveries),
                                  len(recoveries), failed, hung), flush=True)
    return startup, statistics.median(recoveries)


def first_steps(name, argv, workers):
    t0 = time.time()
    proc, lines = launch(argv, environment())
    last = 0
    for _ in range(workers):
        t, _ = wait_for(lines, r"first step rank \d+ restart 0")
        last = max(last, t)
    pss = session_pss(proc.pid)
    stop(proc)
    print("%-32s %d workers: every rank's first step %.3f s; PSS %.0f MiB" % (name, workers, last - t0, pss), flush=True)
    return last - t0, pss


def launchers(args, nproc, restarts):
    common = ["--standalone", "--nproc_per_node", str(nproc), "--max_restarts", str(restarts), "--redirects", "1",
              "--tee", "1"]
    ours = [args.trainctl, "torchrun", "--python", args.python]
    return [
        ("torchrun (torch %s) mi %s" % (args.torch, args.monitor_interval),
         [args.python, "-m", "torch.distributed.run", "--monitor_interval", str(args.monitor_interval)] + common + [WORKER]),
        ("trainctl torchrun", ours + common + [WORKER]),
        ("trainctl torchrun --preload torch", ours + ["--preload", "torch,torch.distributed"] + common + [WORKER]),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="?", default="recovery", choices=["recovery", "startup"])
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--monitor-interval", type=float, default=0.1)
    ap.add_argument("--workers", default="2,8", help="startup: worker counts")
    ap.add_argument("--python", default="/usr/bin/python3", help="the Python (and its torch) both launchers run")
    ap.add_argument("--trainctl", default=os.path.join(ROOT, "build/src/trainctl"))
    args = ap.parse_args()
    args.torch = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"], check=True,
                                capture_output=True, text=True).stdout.strip()
    if args.what == "recovery":
        results = [recovery(name, argv, args.kills) for name, argv in launchers(args, 2, 3 * args.kills)]
        base = results[0]
        for (name, _), r in zip(launchers(args, 2, 0)[1:], results[1:]):
            print("ratio %s / torchrun: start-up %.3f, recovery %.3f" % (name, r[0] / base[0], r[1] / base[1]))
    else:
        for n in (int(w) for w in args.workers.split(",")):
            results = [first_steps(name, argv, n) for name, argv in launchers(args, n, 0)]
            for (name, _), r in zip(launchers(args, n, 0)[1:], results[1:]):
                print("ratio %s / torchrun, %d workers: first steps %.3f, PSS %.3f"
                      % (name, n, r[0] / results[0][0], r[1] / results[0][1]))


if __name__ == "__main__":
    main()
