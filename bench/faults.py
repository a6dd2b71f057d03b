#!/usr/bin/env python3
"""Fault-tolerance benchmarks for issue 4: the Fashion-MNIST job (2-conv CNN, 2 local workers,
batch 64, one thread each) under SIGKILL.

  recovery: SIGKILL a random worker, then measure the time from the kill to the first training
            step completed by the restarted group (metrics.jsonl: a step record with the next
            restart count). Repeated --kills times; reports p50, p99 and max.
            Targets: p50 <= 2 s, p99 <= 5 s over at least 20 kills.
            --kill agent: a random node's agent instead (the launcher starts it again; with
            --nodes 2 the other node's agent stays), the same measure.
  soak:     --minutes of training with a random worker SIGKILLed every --every seconds, then the
            same job (same seed, same step count, deterministic) without kills. Checks: the job
            completes, final test accuracy within 0.5 points of the uninterrupted run, every
            checkpoint left is valid, no process of the job outlives it, restarts == kills.
  hang:     SIGSTOP a random worker, --trials times: time until a live rank reports the stopped
            one by rank and host (target: within timeouts.collective, default 60 s), and until
            the restarted group completes a step.

Prints lines for bench/RESULTS.md. Usage: bench/faults.py recovery|soak|hang [--trainctl PATH] ...
"""
import argparse, glob, json, os, random, shutil, signal, statistics, subprocess, sys, tempfile, time

from hardening import job_pids as run_pids  # a run's processes by --run-id: its agents

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spec(name, out, steps, deterministic, checkpoint_every, nodes=1):
    return f"""name: {name}
nodes: {nodes}
procs_per_node: {2 // nodes}
output_dir: {out}
# backoff 0s: the kills come in a row by design, and the restart back-off (1 s, doubling, for
# failures in a row) would be measured instead of the recovery; torchrun restarts at once too.
restart: {{max_restarts: 10000, backoff: 0s}}
trainer:
  model: cnn
  epochs: 1000
  max_steps: {steps}
  batch_size: 64
  threads: 1
  seed: 7
  deterministic: {str(deterministic).lower()}
  optimizer: {{name: sgd, lr: 0.05, momentum: 0.9}}
  log_every: 1
  checkpoint_every: {checkpoint_every}
  eval: false
"""


def job_pids(name, extra=()):
    """Live processes whose environment says they belong to job `name` (and to `extra`)."""
    want = [f"TRAINCTL_JOB_NAME={name}".encode()] + [e.encode() for e in extra]
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
            state = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and all(w in env for w in want):
            pids.append(int(d))
    return pids


class Metrics:
    """Tails metrics.jsonl."""

    def __init__(self, path):
        self.path, self.pos, self.steps = path, 0, []

    def poll(self):
        try:
            with open(self.path) as f:
                f.seek(self.pos)
                chunk = f.read()
        except FileNotFoundError:
            return
        end = chunk.rfind("\n") + 1
        self.pos += len(chunk[:end].encode())
        for line in chunk[:end].splitlines():
            r = json.loads(line)
            if "loss" in r:
                self.steps.append(r)


def start(trainctl, text, out):
    path = out + ".yaml"
    open(path, "w").write(text)
    log = open(out + ".log", "w")
    return subprocess.Popen([trainctl, "run", path], stdout=log, stderr=subprocess.STDOUT)


def wait_for(cond, timeout, what):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.01)


def kill_one(pids):
    """SIGKILLs one of `pids`, chosen at random; returns when."""
    pid = random.choice(pids)
    t = time.time()
    os.kill(pid, signal.SIGKILL)
    return t


def kill_random_worker(name, restart):
    return kill_one(job_pids(name, [f"TORCHELASTIC_RESTART_COUNT={restart}", "LOCAL_RANK=0"]) +
                    job_pids(name, [f"TORCHELASTIC_RESTART_COUNT={restart}", "LOCAL_RANK=1"]))


def kill_random_agent(name):
    """SIGKILLs one of the agents of the job `name` (their command line: agent --run-id NAME-...)."""
    return kill_one(run_pids(name + "-"))


def wait_trained(m, restart, n):
    """Waits until attempt `restart` of the job has completed `n` training steps."""
    def trained():
        m.poll()
        return sum(1 for r in m.steps if r["restart"] == restart) >= n
    wait_for(trained, 120, f"restart {restart} to train")


def recovery(a):
    tmp = tempfile.mkdtemp(prefix="bench-recovery-")
    out = os.path.join(tmp, "job")
    proc = start(a.trainctl, spec("bench-recovery", out, 10**7, False, 50, a.nodes), out)
    m = Metrics(os.path.join(out, "metrics.jsonl"))
    times = []
    for i in range(a.kills):
        wait_trained(m, i, 5)
        time.sleep(random.uniform(0, 1))
        t = kill_random_agent("bench-recovery") if a.kill == "agent" else kill_random_worker("bench-recovery", i)
        wait_for(lambda: any(r["restart"] == i + 1 for r in (m.poll() or m.steps)), 60,
                 f"restart {i + 1}")
        first = next(r for r in m.steps if r["restart"] == i + 1)
        times.append(first["time"] - t)
        print(f"kill {i + 1}: {times[-1]:.2f} s", flush=True)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    time.sleep(0.5)
    left = job_pids("bench-recovery")
    times.sort()
    p = lambda q: times[min(len(times) - 1, int(round(q * (len(times) - 1))))]
    print(f"recovery, SIGKILL of {'an agent' if a.kill == 'agent' else 'a worker'} ({a.nodes} node(s) x "
          f"{2 // a.nodes} worker(s)) to the next completed step, {len(times)} kills: "
          f"p50 {statistics.median(times):.2f} s, p99 {p(0.99):.2f} s, max {times[-1]:.2f} s, "
          f"min {times[0]:.2f} s (targets: p50 <= 2 s, p99 <= 5 s); "
          f"processes left after the job: {len(left)}")


def hang(a):
    """SIGSTOP a random worker; time until a live rank reports it by rank and host, and until
    the restarted group completes a step."""
    tmp = tempfile.mkdtemp(prefix="bench-hang-")
    out = os.path.join(tmp, "job")
    text = spec("bench-hang", out, 10**7, False, 50) + \
        (f"timeouts: {{collective: {a.timeout}s}}\n" if a.timeout else "")
    proc = start(a.trainctl, text, out)
    m = Metrics(os.path.join(out, "metrics.jsonl"))
    rows = []
    for i in range(a.trials):
        wait_trained(m, i, 5)
        rank = random.choice([0, 1])
        pid = job_pids("bench-hang", [f"TORCHELASTIC_RESTART_COUNT={i}", f"RANK={rank}"])[0]
        t = time.time()
        os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: any(r["restart"] == i + 1 for r in (m.poll() or m.steps)), 600,
                 f"restart {i + 1}")
        recovered = next(r for r in m.steps if r["restart"] == i + 1)["time"] - t
        report = next(l for l in open(out + ".log") if "stalled or unreachable" in l and
                      f"restart={i}]" in l)
        stamp = report.split("] ", 1)[1].split(" ")[0]  # the worker's own log time
        reported = time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) + \
            float(stamp[19:]) - time.timezone - t
        named = f"stalled or unreachable: rank {rank} on " in report and f"pid {pid})" in report
        rows.append((rank, reported, recovered, named))
        print(f"SIGSTOP rank {rank}: reported after {reported:.1f} s, naming it: {named}; "
              f"next step after {recovered:.1f} s", flush=True)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    time.sleep(0.5)
    print(f"hang: collective timeout {a.timeout or 60} s, {len(rows)} SIGSTOPs: reported after "
          f"{' '.join('%.1f' % r[1] for r in rows)} s, stopped rank and host named in "
          f"{sum(r[3] for r in rows)}/{len(rows)}, next step after "
          f"{' '.join('%.1f' % r[2] for r in rows)} s; processes left {len(job_pids('bench-hang'))}")


def accuracy(trainctl, model):
    r = subprocess.run([trainctl, "eval", "--checkpoint", model, "-o", "json"], check=True,
                       capture_output=True, text=True)
    return json.loads(r.stdout)["accuracy"]


def soak(a):
    tmp = tempfile.mkdtemp(prefix="bench-soak-")
    steps = a.steps
    out = os.path.join(tmp, "soak")
    t0 = time.time()
    proc = start(a.trainctl, spec("bench-soak", out, steps, True, a.checkpoint_every), out)
    m = Metrics(os.path.join(out, "metrics.jsonl"))
    kills = 0
    next_kill = t0 + a.every
    while proc.poll() is None:
        time.sleep(0.1)
        if time.time() < next_kill:
            continue
        m.poll()
        if m.steps and m.steps[-1]["restart"] == kills and m.steps[-1]["step"] < steps - 20:
            kill_random_worker("bench-soak", kills)
            kills += 1
            print(f"{time.time() - t0:.0f} s: kill {kills}", flush=True)
        next_kill = time.time() + a.every
    soak_seconds = time.time() - t0
    time.sleep(0.5)
    left = job_pids("bench-soak")
    status = json.load(open(os.path.join(out, "status.json")))
    ckpts = sorted(glob.glob(os.path.join(out, "checkpoints", "*.safetensors")))
    bad = 0
    for c in ckpts:
        r = subprocess.run([a.trainctl, "eval", "--checkpoint", c, "--limit", "100"],
                           capture_output=True, text=True)
        bad += r.returncode != 0
    acc_soak = accuracy(a.trainctl, os.path.join(out, "model.safetensors"))

    ref = os.path.join(tmp, "ref")
    t1 = time.time()
    rproc = start(a.trainctl, spec("bench-soak-ref", ref, steps, True, a.checkpoint_every), ref)
    rproc.wait()
    ref_seconds = time.time() - t1
    acc_ref = accuracy(a.trainctl, os.path.join(ref, "model.safetensors"))
    print(f"soak: {steps} steps in {soak_seconds:.0f} s with a worker SIGKILLed every {a.every} s: "
          f"exit {proc.returncode}, kills {kills}, restarts {status['restarts']}, "
          f"test accuracy {acc_soak:.4f} vs {acc_ref:.4f} uninterrupted ({ref_seconds:.0f} s), "
          f"difference {abs(acc_soak - acc_ref) * 100:.2f} points (target <= 0.5); "
          f"checkpoints left {len(ckpts)}, invalid {bad}; processes left {len(left)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["recovery", "soak", "hang"])
    ap.add_argument("--trials", type=int, default=3, help="hang: SIGSTOPs")
    ap.add_argument("--timeout", type=int, default=0, help="hang: timeouts.collective (0: default)")
    ap.add_argument("--trainctl", default=os.path.join(ROOT, "build", "src", "trainctl"))
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--kill", choices=["worker", "agent"], default="worker", help="recovery: what is killed")
    ap.add_argument("--nodes", type=int, choices=[1, 2], default=1, help="recovery: nodes (x 2/nodes workers)")
    ap.add_argument("--steps", type=int, default=468 * 60, help="soak: training steps")
    ap.add_argument("--every", type=float, default=30, help="soak: seconds between kills")
    ap.add_argument("--checkpoint-every", type=int, default=100)
    a = ap.parse_args()
    # Run a copy, so that a rebuild during a long run does not change what runs.
    bin_dir = tempfile.mkdtemp(prefix="bench-faults-bin-")
    for f in ("trainctl", "trainctl-torch.so", "trainctl-http.so"):
        shutil.copy2(os.path.join(os.path.dirname(a.trainctl), f), bin_dir)
    a.trainctl = os.path.join(bin_dir, "trainctl")
    random.seed(1)
    {"recovery": recovery, "soak": soak, "hang": hang}[a.mode](a)


if __name__ == "__main__":
    main()
