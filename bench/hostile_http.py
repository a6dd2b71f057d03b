#!/usr/bin/env python3
"""Hostile clients against trainctl's listening servers for a while (issue 49's soak).

Starts `trainctl dashboard` (its page, API and /metrics: the same HTTP server as the agents'
/metrics) and a local job (its store, on the launcher's Unix socket), then for --seconds keeps:
  - 100 slow connections to the dashboard that send a request head a byte at a time, never whole
    (each closed by the server at its head deadline is opened again);
  - clients sending 200 headers, 64 KiB heads, 100 KiB bodies and POSTs, without the token, in a loop;
  - clients asking for every page without the token, in a loop;
  - 100 connections to the job's store that never say hello, opened again as they are closed;
and meanwhile asks the dashboard with the token twice a second. Prints, as markdown for
bench/RESULTS.md: the dashboard's and the launcher's resident memory (start, peak, end), the
authorized requests' latency (p50, p99, max) and how many failed.
Usage: bench/hostile_http.py [--trainctl PATH] [--seconds 120]
"""
import argparse, os, re, socket, statistics, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_mib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def ask(port, request, timeout=10):
    """Sends a request, returns the answer's status line ('' when the connection failed)."""
    try:
        with connect(port) as s:
            s.settimeout(timeout)
            s.sendall(request)
            s.shutdown(socket.SHUT_WR)
            got = b""
            while not got.endswith(b"\n") and b"\r\n" not in got:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
            return got.split(b"\r\n", 1)[0].decode(errors="replace")
    except OSError:
        return ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainctl", default=os.path.join(ROOT, "build/src/trainctl"))
    ap.add_argument("--seconds", type=float, default=120)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="trainctl-hostile-")
    env = dict(os.environ, TRAINCTL_STATE_DIR=os.path.join(tmp, "state"))
    spec = os.path.join(tmp, "job.yaml")
    open(spec, "w").write(f"name: soaked\nprocs_per_node: 2\noutput_dir: {tmp}/out\n"
                          "command: [sh, -c, 'echo up; sleep 100000']\n")
    job = subprocess.Popen([a.trainctl, "run", spec], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    dash = subprocess.Popen([a.trainctl, "dashboard"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = ""
    while not url:
        line = dash.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=([0-9a-f]+)", line)
        if m:
            port, token = int(m.group(1)), m.group(2)
            url = line.strip()
    store = None
    deadline = time.time() + 30
    while store is None and time.time() < deadline:  # the job's store: its workers' environment
        for pid in os.listdir("/proc"):
            try:
                e = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            for kv in e:
                if kv.startswith(b"TRAINCTL_STORE_ADDR=") and b"TRAINCTL_JOB_NAME=soaked" in e:
                    store = kv.split(b"=", 1)[1].decode()
        time.sleep(0.2)
    stop = threading.Event()
    counts = {"slow": 0, "hostile": 0, "tokenless": 0, "store": 0}

    def hold(kind, open_one, poke, every):
        """Keeps 100 connections of `kind` open, each opened again once the server closes it."""
        conns = []
        while not stop.is_set():
            while len(conns) < 100:
                try:
                    conns.append(open_one())
                    counts[kind] += 1
                except OSError:
                    break
            for c in list(conns):
                try:
                    if not poke(c):
                        raise OSError("closed")
                except BlockingIOError:
                    pass
                except OSError:
                    conns.remove(c)
                    c.close()
            time.sleep(every)
        for c in conns:
            c.close()

    def open_slow():
        c = connect(port)
        c.sendall(b"GET /api/runs HTTP/1.1\r\n")
        return c

    def slow():  # a byte a second: never a whole head
        hold("slow", open_slow, lambda c: c.sendall(b"X") is None, 1)

    many = b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n"
    requests = [many, b"GET / HTTP/1.1\r\nX: " + b"a" * 65536,
                b"GET /metrics HTTP/1.1\r\nContent-Length: 100000000\r\n\r\n" + b"b" * 102400,
                b"POST /api/runs HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789"]

    def hostile():
        while not stop.is_set():
            for r in requests:
                ask(port, r)
                counts["hostile"] += 1

    def tokenless():
        while not stop.is_set():
            for path in ("/", "/api/runs", "/metrics", "/api/runs/x/eval"):
                ask(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                counts["tokenless"] += 1

    def store_flood():  # connections that never say hello
        if not store or not store.startswith("unix:"):  # a local job's: unix:@name
            return
        name = store[len("unix:"):]
        path = "\0" + name[1:] if name.startswith("@") else name

        def open_store():
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(path)
            c.setblocking(False)
            return c

        hold("store", open_store, lambda c: c.recv(1) != b"", 0.5)

    threads = [threading.Thread(target=f) for f in (slow, hostile, hostile, tokenless, store_flood)]
    rss = {"dashboard": [rss_mib(dash.pid)], "launcher": [rss_mib(job.pid)]}
    for t in threads:
        t.start()
    latencies, failed = [], 0
    end = time.time() + a.seconds
    authorized = f"GET /api/runs?token={token} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    while time.time() < end:
        t0 = time.perf_counter()
        status = ask(port, authorized)
        if status.startswith("HTTP/1.1 200"):
            latencies.append((time.perf_counter() - t0) * 1000)
        else:
            failed += 1
        rss["dashboard"].append(rss_mib(dash.pid))
        rss["launcher"].append(rss_mib(job.pid))
        time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    for p in (dash, job):
        p.terminate()
        p.wait(timeout=60)
    latencies.sort()
    q = lambda f: latencies[min(len(latencies) - 1, int(f * len(latencies)))]
    print(f"| soak | {a.seconds:.0f} s |")
    print("|---|---|")
    print(f"| hostile connections opened | slow {counts['slow']}, oversized/body/POST {counts['hostile']}, "
          f"tokenless {counts['tokenless']}, store without hello {counts['store']} |")
    for k, v in rss.items():
        print(f"| {k} RSS MiB (start / peak / end) | {v[0]:.1f} / {max(v):.1f} / {v[-1]:.1f} |")
    if latencies:
        print(f"| authorized request ms (p50 / p99 / max), {len(latencies)} ok, {failed} failed | "
              f"{statistics.median(latencies):.2f} / {q(0.99):.2f} / {latencies[-1]:.2f} |")
    else:
        print(f"| authorized requests | all {failed} failed |")
    return 0 if latencies and failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
