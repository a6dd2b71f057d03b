#!/usr/bin/env python3
"""The job's store and launcher under abuse (issue 20), against the real trainctl binary.

  1. clients without the token, each announcing a 60 MiB frame and sending 1 MiB of it: the
     launcher's (the store server's) peak resident memory, sampled every 20 ms
  2. a flood of connections that never say hello: how long a client with the token waits for
     its hello's answer (connect + hello + reply), 50 times
  3. SIGTERM while a 400-node local job is starting: the time until no process of the job is left
Prints markdown for bench/RESULTS.md. Usage: bench/hardening.py [--trainctl PATH]
"""
import argparse, os, resource, signal, socket, statistics, struct, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_kib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def job_env(name):
    """The environment of a worker of job `name` (its store address and token)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = dict(kv.split(b"=", 1) for kv in open(f"/proc/{pid}/environ", "rb").read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if env.get(b"TRAINCTL_JOB_NAME") == name.encode() and b"TRAINCTL_STORE_TOKEN" in env:
            return env
    return None


def job_pids(prefix):
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and b"--run-id" in cmd and cmd[cmd.index(b"--run-id") + 1].startswith(prefix.encode()):
            out.append(int(pid))
    return out


def connect(addr, timeout=None):
    """A connection to the store at `addr`, as TRAINCTL_STORE_ADDR gives it: tcp://host:port, or
    unix:@name (a local job's store: a Unix socket in the abstract namespace) or unix:PATH."""
    if addr.startswith("unix:"):
        path = addr[len("unix:"):]
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect("\0" + path[1:] if path.startswith("@") else path)
        return s
    host, port = addr[len("tcp://"):].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def frame(kind, rest):
    """A frame of trainctl's wire (src/common/wire.h): kind, the length of the rest, the rest."""
    return bytes([kind]) + struct.pack("<Q", len(rest)) + rest


def hello(addr, token):
    s = connect(addr, timeout=10)
    s.sendall(frame(1, struct.pack("<q", 2) + struct.pack("<I", len(token)) + token))  # kHello, version 2
    head = s.recv(9)
    s.close()
    return len(head) == 9 and head[0] == 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainctl", default=os.path.join(ROOT, "build", "src", "trainctl"))
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    tmp = tempfile.mkdtemp(prefix="bench-hardening-")
    spec = os.path.join(tmp, "job.yaml")
    with open(spec, "w") as f:
        f.write(f"name: bench-hard\ncommand: [sleep, '120']\noutput_dir: {tmp}/out\n")
    job = subprocess.Popen([a.trainctl, "--log-level", "warn", "run", spec], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    env = None
    while env is None and job.poll() is None:
        env = job_env("bench-hard")
        time.sleep(0.05)
    addr = env[b"TRAINCTL_STORE_ADDR"].decode()
    token = env[b"TRAINCTL_STORE_TOKEN"]

    # 1: big frames before the token.
    base = rss_kib(job.pid)
    socks, peak = [], base
    chunk = b"x" * (1 << 20)
    for _ in range(100):
        s = connect(addr)
        s.setblocking(False)
        s.send(bytes([1]) + struct.pack("<Q", 60 << 20))  # a 60 MiB "hello"
        try:
            s.send(chunk)
        except (BlockingIOError, ConnectionError):
            pass
        socks.append(s)
        peak = max(peak, rss_kib(job.pid))
    end = time.monotonic() + 3
    while time.monotonic() < end:
        peak = max(peak, rss_kib(job.pid))
        time.sleep(0.02)
    closed = 0
    for s in socks:
        try:
            s.setblocking(True)
            s.settimeout(2)
            while s.recv(65536):
                pass
            closed += 1
        except (ConnectionError, socket.timeout, OSError):
            closed += 1
        s.close()
    print(f"100 clients without the token, each announcing a 60 MiB frame and sending 1 MiB: the "
          f"launcher's resident memory {base / 1024:.1f} MiB before, peak {peak / 1024:.1f} MiB "
          f"(+{(peak - base) / 1024:.1f} MiB); {closed} of 100 connections closed by the server")

    # 2: a flood of silent connections, and a client with the token.
    flood = []
    for _ in range(2000):
        try:
            flood.append(connect(addr))
        except OSError:
            break
    times = []
    for _ in range(50):
        t = time.monotonic()
        ok = hello(addr, token)
        times.append((time.monotonic() - t) * 1000)
        if not ok:
            times[-1] = float("inf")
    for s in flood:
        s.close()
    times.sort()
    print(f"{len(flood)} connections that never say hello: a client with the token got its hello "
          f"answered in median {statistics.median(times):.2f} ms, p98 {times[48]:.2f} ms, max {times[-1]:.2f} ms "
          f"(50 tries)")
    job.send_signal(signal.SIGTERM)
    job.wait()

    # 3: SIGTERM during a large start-up.
    with open(spec, "w") as f:
        f.write(f"name: bench-start\nnodes: 400\ncommand: [sleep, '120']\noutput_dir: {tmp}/start\n"
                f"timeouts: {{rendezvous: 120s}}\n")
    job = subprocess.Popen([a.trainctl, "--log-level", "warn", "run", spec], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    while len(job_pids("bench-start")) < 50:
        time.sleep(0.01)
    started = len(job_pids("bench-start"))
    t = time.monotonic()
    job.send_signal(signal.SIGTERM)
    code = job.wait()
    exited = time.monotonic() - t
    while job_pids("bench-start"):
        time.sleep(0.01)
    gone = time.monotonic() - t
    print(f"SIGTERM with {started} of 400 agents started: trainctl exited {code} after {exited:.2f} s, "
          f"nothing of the job left after {gone:.2f} s")


if __name__ == "__main__":
    main()
