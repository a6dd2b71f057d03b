#!/usr/bin/env python3
"""Parameter servers against allreduce (issue 16), side by side in one run.

Every run trains the 2-conv CNN on the real Fashion-MNIST, batch 64 per worker, one compute thread
per worker, SGD (lr 0.05, momentum 0.9), 2 workers:
  1. allreduce (shared memory)            -> epoch time (training only, worker 0's record)
  2. parameter_server sync, 1 ps          -> the same; target: <= 1.15x of (1)
  3. parameter_server async, 1 ps         -> the same
1-3 run one epoch each, in turn, for --rounds rounds; ratios are taken within a round and the
median round is reported (the machine's speed drifts between minutes).
  4. each of 1-3 for --accuracy-epochs epochs with evaluation -> test accuracy (targets: sync
     >= 0.91, async >= 0.90 after 5 epochs); async, whose order of updates differs run to run,
     with seeds 0, 1 and 2, and the median reported
  5. the seed's layout: 8 ps + 16 workers of the built-in trainer on this machine, one epoch ->
     completes?, epoch time, total resident memory of all its processes (peak of the sum,
     sampled every 0.2 s)
  6. async with a worker SIGKILLed in its second epoch -> the job goes on without a group
     restart (status.json), the replacement's start, worker 0's throughput around the kill, and
     the job's wall time against the same job not killed
Prints markdown for bench/RESULTS.md. Usage: bench/parameter_server.py [--trainctl PATH]
"""
import argparse, json, os, signal, statistics, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spec(name, out, strategy, epochs, eval_, mode="sync", ps=1, workers=2, extra="", seed=0):
    trainer = f"""trainer:
  model: cnn
  seed: {seed}
  epochs: {epochs}
  batch_size: 64
  threads: 1
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9}}
  log_every: 20
  eval: {str(eval_).lower()}
{extra}"""
    if strategy == "allreduce":
        return f"name: {name}\nprocs_per_node: {workers}\noutput_dir: {out}\n" + trainer
    return (f"name: {name}\noutput_dir: {out}\nrestart: {{max_restarts: 3}}\n" + trainer +
            f"  strategy: parameter_server\n  parameter_server: {{mode: {mode}}}\n"
            f"roles: [{{name: ps, replicas: {ps}}}, {{name: worker, replicas: {workers}}}]\n")


def start(trainctl, text, out):
    path = out + ".yaml"
    with open(path, "w") as f:
        f.write(text)
    return subprocess.Popen([trainctl, "--log-level", "warn", "run", path], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def results(proc, out):
    if proc.wait() != 0:
        sys.exit(f"trainctl failed ({proc.returncode}); its logs are in {out}/logs")
    records = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    return records


def run(trainctl, text, out):
    return results(start(trainctl, text, out), out)


def epochs_of(records):
    return [r for r in records if "epoch_seconds" in r]


def accuracy(records):
    acc = [r["test_accuracy"] for r in records if "test_accuracy" in r]
    return acc[-1] if acc else float("nan")


def job_rss_mb(job):
    """The resident memory (MiB) of every process of job `job` now (TRAINCTL_JOB_NAME, and the
    launcher and agents, which carry the job's name in their command line or output dir)."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = open(f"/proc/{pid}/environ", "rb").read()
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            if (b"TRAINCTL_JOB_NAME=" + job.encode() + b"\0") not in env and job.encode() not in cmd:
                continue
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def sampled_peak(job, proc):
    peak = [0.0]

    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], job_rss_mb(job))
            time.sleep(0.2)
    t = threading.Thread(target=sample)
    t.start()
    return t, peak


def task_pid(role, index, job):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if (f"ROLE_NAME={role}".encode() in env and f"ROLE_RANK={index}".encode() in env and
                f"TRAINCTL_JOB_NAME={job}".encode() in env):
            return int(pid)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainctl", default=os.path.join(ROOT, "build", "src", "trainctl"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--accuracy-epochs", type=int, default=5)
    ap.add_argument("--only-kill", action="store_true", help="run part 6 only")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-ps-")
    t = a.trainctl
    configs = [("allreduce", "allreduce", "sync"), ("sync", "parameter_server", "sync"),
               ("async", "parameter_server", "async")]

    if a.only_kill:
        return kill_test(t, tmp)

    # 1-3: one epoch each, in turn.
    secs = {name: [] for name, _, _ in configs}
    waits = {name: [] for name, _, _ in configs}
    for r in range(a.rounds):
        for name, strategy, mode in configs:
            out = os.path.join(tmp, f"{name}{r}")
            e = epochs_of(run(t, spec(f"b-{name}", out, strategy, 1, False, mode), out))[0]
            secs[name].append(e["epoch_seconds"])
            waits[name].append(e.get("ps_wait_seconds", e.get("allreduce_wait_seconds", 0)))
    med = lambda k: statistics.median(secs[k])
    print("| run (2 workers, 1 epoch) | median epoch (s) | epochs, round by round (s) | waited for the others / the shards (s) |")
    print("|---|---|---|---|")
    for name, _, _ in configs:
        print(f"| {name} | {med(name):.2f} | {' '.join('%.2f' % x for x in secs[name])} | "
              f"{' '.join('%.2f' % x for x in waits[name])} |")
    print()
    for name in ("sync", "async"):
        ratios = [x / y for x, y in zip(secs[name], secs["allreduce"])]
        target = "  (target <= 1.15)" if name == "sync" else ""
        print(f"{name} / allreduce: median {statistics.median(ratios):.3f}, rounds "
              f"{' '.join('%.3f' % x for x in ratios)}{target}")
    print()

    # 4: accuracy.
    print(f"| run (2 workers, {a.accuracy_epochs} epochs) | test accuracy by epoch (worker 0) | epoch times (s) |")
    print("|---|---|---|")
    finals = []
    for name, strategy, mode in configs + [("async", "parameter_server", "async")] * 2:
        seed = len(finals) - 2 if name == "async" else 0
        out = os.path.join(tmp, f"acc-{name}{seed}")
        rec = run(t, spec(f"a-{name}", out, strategy, a.accuracy_epochs, True, mode, seed=seed), out)
        acc = [r["test_accuracy"] for r in rec if "test_accuracy" in r]
        finals.append(acc[-1])
        print(f"| {name} (seed {seed}) | {' '.join('%.4f' % x for x in acc)} | "
              f"{' '.join('%.2f' % e['epoch_seconds'] for e in epochs_of(rec))} |")
    print(f"\nafter {a.accuracy_epochs} epochs: allreduce {finals[0]:.4f}, sync {finals[1]:.4f} (target >= 0.91), "
          f"async median of 3 seeds {statistics.median(finals[2:]):.4f} (target >= 0.90)")
    print()

    # 5: 8 ps + 16 workers.
    out = os.path.join(tmp, "seed")
    began = time.monotonic()
    proc = start(t, spec("b-seed", out, "parameter_server", 1, False, ps=8, workers=16), out)
    sampler, peak = sampled_peak("b-seed", proc)
    rec = results(proc, out)
    sampler.join()
    wall = time.monotonic() - began
    status = json.load(open(os.path.join(out, "status.json")))
    e = epochs_of(rec)[0]
    print(f"8 ps + 16 workers (sync), 1 epoch: {status['state']}, epoch {e['epoch_seconds']:.1f} s "
          f"(worker 0), wall {wall:.1f} s from trainctl run to exit, peak total RSS of its processes "
          f"{peak[0]:.0f} MiB, worker 0 peak RSS {e['peak_rss_mb']:.0f} MiB")
    print()

    kill_test(t, tmp)


def kill_test(t, tmp):
    # 6: async, a worker killed in its second epoch, against the same job not killed.
    walls = {}
    for killed in (False, True):
        out = os.path.join(tmp, f"kill{int(killed)}")
        began = time.monotonic()
        proc = start(t, spec(f"b-kill{int(killed)}", out, "parameter_server", 3, False, "async"), out)
        kill_at = None
        kill_step = 0
        if killed:
            metrics = os.path.join(out, "metrics.jsonl")
            while proc.poll() is None:
                lines = open(metrics).read().splitlines() if os.path.exists(metrics) else []
                kill_step = max([json.loads(l).get("step", 0) for l in lines if l.endswith("}")] or [0])
                if kill_step >= 468 + 200:  # mid second epoch (468 steps per epoch)
                    break
                time.sleep(0.05)
            pid = task_pid("worker", 1, "b-kill1")
            if pid:
                os.kill(pid, signal.SIGKILL)
                kill_at = time.time()
        rec = results(proc, out)
        walls[killed] = time.monotonic() - began
        status = json.load(open(os.path.join(out, "status.json")))
        if killed:
            log = open(os.path.join(out, "logs", "worker-1.log")).read()
            resumed = [l for l in log.splitlines() if "going on from step" in l]
            rates = [(r["time"], r["samples_per_s"]) for r in rec if "samples_per_s" in r]
            before = [s for (ts, s) in rates if kill_at - 5 <= ts < kill_at]
            after = [s for (ts, s) in rates if kill_at <= ts < kill_at + 2]
            later = [s for (ts, s) in rates if kill_at + 2 <= ts < kill_at + 7]
            mean = lambda v: statistics.mean(v) if v else float("nan")
            print(f"async, worker 1 SIGKILLed when worker 0 was at step {kill_step}: state {status['state']}, group restarts {status['restarts']}, task restarts "
                  f"{status.get('task_restarts', 0)}; the replacement: {resumed[0].split('] ')[-1] if resumed else 'none'}")
            print(f"worker 0's own throughput (its steps/s x batch x 2 workers): 5 s before the kill "
                  f"{mean(before):.0f}/s, the 2 s after {mean(after):.0f}/s, 2-7 s after {mean(later):.0f}/s")
    print(f"async 3 epochs wall time: not killed {walls[False]:.1f} s, killed {walls[True]:.1f} s")


if __name__ == "__main__":
    main()
