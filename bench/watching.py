#!/usr/bin/env python3
"""What watching a job costs (issue 18), side by side in one run:

1. Training with the dashboard open and Prometheus scraping: the Fashion-MNIST example job
   (2 workers, one epoch) run alternately alone (A) and while `trainctl dashboard` serves a
   client that polls as the page does (runs list, the run, its log every 2 s) and a scraper that
   reads /metrics every second (B). Figures: the epoch time from the run's metrics.jsonl, and the
   CPU time the dashboard process used during B against the CPU time of the training it watched
   (on a machine whose cores the training fills, that share is what watching can take from it;
   the epoch-time A/B alone drowns in a shared VM's noise).
2. `trainctl ps` with 100 finished runs in the index: wall time of `ps` and `ps --all`.

Usage: bench/watching.py [--rounds 5] [--trainctl build/src/trainctl]
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def epoch_seconds(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r["epoch_seconds"] for r in rows if "epoch_seconds" in r][0]


def cpu_seconds(pid):
    """utime + stime of a live process, from /proc/PID/stat."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def train(trainctl, state, out_dir):
    env = dict(os.environ, TRAINCTL_STATE_DIR=state)
    subprocess.run([trainctl, "run", os.path.join(ROOT, "examples/fashion-mnist.yaml"), "--set", "trainer.epochs=1",
                    "--set", "output_dir=" + out_dir, "--set", "trainer.eval=false"],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return epoch_seconds(out_dir)


class Watchers:
    """The dashboard, a client polling like its page, and a Prometheus-like scraper."""

    def __init__(self, trainctl, state):
        env = dict(os.environ, TRAINCTL_STATE_DIR=state)
        self.proc = subprocess.Popen([trainctl, "dashboard"], env=env, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"(http://[0-9.:]+)/\?token=([0-9a-f]+)", line)
        self.base, self.token = m.group(1), m.group(2)
        self.stop = threading.Event()
        self.requests = 0
        self.threads = [threading.Thread(target=self.page, daemon=True), threading.Thread(target=self.scrape, daemon=True)]
        for t in self.threads:
            t.start()

    def get(self, path):
        sep = "&" if "?" in path else "?"
        with urllib.request.urlopen(self.base + path + sep + "token=" + self.token, timeout=30) as r:
            self.requests += 1
            return r.read()

    def page(self):
        while not self.stop.is_set():
            runs = json.loads(self.get("/api/runs"))
            live = [r for r in runs if r["alive"]]
            if live:
                self.get("/api/runs/" + live[0]["run_id"])
                self.get("/api/runs/" + live[0]["run_id"] + "/logs?rank=0")
            self.stop.wait(2)

    def scrape(self):
        while not self.stop.is_set():
            self.get("/metrics")
            self.stop.wait(1)

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join()
        self.proc.terminate()
        self.proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--trainctl", default=os.path.join(ROOT, "build/src/trainctl"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = os.path.join(tmp, "state")
        alone, watched, requests, shares = [], [], 0, []
        for i in range(args.rounds):
            alone.append(train(args.trainctl, state, os.path.join(tmp, "a%d" % i)))
            w = Watchers(args.trainctl, state)
            try:
                dash0, train0 = cpu_seconds(w.proc.pid), children_cpu()
                watched.append(train(args.trainctl, state, os.path.join(tmp, "b%d" % i)))
                dash, trained = cpu_seconds(w.proc.pid) - dash0, children_cpu() - train0
            finally:
                w.close()
            requests += w.requests
            shares.append(dash / trained)
            print("round %d: alone %.3f s, watched %.3f s (%d requests); dashboard CPU %.3f s of the training's %.1f s (%.3f %%)"
                  % (i + 1, alone[-1], watched[-1], w.requests, dash, trained, 100 * shares[-1]))
        a, b = statistics.median(alone), statistics.median(watched)
        print("epoch time, median of %d: alone %.3f s, dashboard + 1 Hz scrape %.3f s: ratio %.4f (%+.2f %%)"
              % (args.rounds, a, b, b / a, 100 * (b / a - 1)))
        print("dashboard CPU / training CPU: median %.3f %%, max %.3f %%" % (100 * statistics.median(shares), 100 * max(shares)))

        # trainctl ps with 100 finished runs.
        ps_state = os.path.join(tmp, "ps-state")
        env = dict(os.environ, TRAINCTL_STATE_DIR=ps_state)
        spec = os.path.join(tmp, "noop.yaml")
        with open(spec, "w") as f:
            f.write("name: noop\ncommand: ['true']\noutput_dir: %s\n" % os.path.join(tmp, "noop"))
        for i in range(100):
            subprocess.run([args.trainctl, "run", spec], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for flags in ([], ["--all"]):
            times = []
            for _ in range(10):
                t0 = time.perf_counter()
                out = subprocess.run([args.trainctl, "ps"] + flags, env=env, check=True, capture_output=True, text=True).stdout
                times.append(time.perf_counter() - t0)
            print("trainctl ps %s with 100 finished runs: median %.1f ms, max %.1f ms (%d lines)"
                  % (" ".join(flags) or "(newest per job)", 1000 * statistics.median(times), 1000 * max(times),
                     len(out.splitlines())))


if __name__ == "__main__":
    main()
