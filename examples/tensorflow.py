"""A program that follows TensorFlow's distributed conventions and reads nothing but TF_CONFIG.

It stands in for your TensorFlow train.py (TensorFlow is not a Debian package) and runs the way
Kubeflow's TFJob runs one: each task learns its type, its index and every peer's host:port from
TF_CONFIG, serves on its own address, and talks to its peers over TCP. The standard library only.
Results go to standard output, and to files in $OUT when it is set.

- ps:        serves forever: answers each connection with "ps <index>".
- worker:    asks every ps who it is, reports "worker <index> saw <ps answers>" to the chief,
             then serves forever (as a TF worker server does) until the job is over.
- chief:     collects one report from every worker, prints them (and writes $OUT/chief.txt), exits 0.
- evaluator: checks that it is outside the cluster map, says so (and writes $OUT/evaluator.txt), exits 0.
"""
import json
import os
import socket
import sys
import time

config = json.loads(os.environ["TF_CONFIG"])
cluster = config["cluster"]
kind = config["task"]["type"]
index = config["task"]["index"]
out = os.environ.get("OUT")


def report(name, text):
    print(text, end="", flush=True)
    if out:
        with open(os.path.join(out, name), "w") as f:
            f.write(text)


def split(addr):
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def listen(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(split(addr))
    s.listen(64)
    return s


def ask(addr, message, deadline):
    """Connects to a peer (retrying while it starts), sends a line, returns its one-line answer."""
    while True:
        try:
            with socket.create_connection(split(addr), timeout=5) as c:
                c.sendall((message + "\n").encode())
                return c.makefile().readline().strip()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def serve(server, answer):
    while True:
        conn, _ = server.accept()
        with conn:
            request = conn.makefile().readline().strip()
            conn.sendall((answer(request) + "\n").encode())


deadline = time.monotonic() + 60
if kind == "evaluator":
    assert "evaluator" not in cluster, cluster
    report("evaluator.txt", "evaluator %d saw %s\n" % (index, ",".join(sorted(cluster))))
elif kind == "ps":
    serve(listen(cluster["ps"][index]), lambda request: "ps %d" % index)
elif kind == "worker":
    server = listen(cluster["worker"][index])
    seen = [ask(addr, "who", deadline) for addr in cluster["ps"]]
    ask(cluster["chief"][0], "worker %d saw %s" % (index, ",".join(seen)), deadline)
    serve(server, lambda request: "worker %d" % index)
elif kind == "chief":
    server = listen(cluster["chief"][0])
    reports = []
    while len(reports) < len(cluster["worker"]):
        conn, _ = server.accept()
        with conn:
            reports.append(conn.makefile().readline().strip())
            conn.sendall(b"ok\n")
    report("chief.txt", "\n".join(sorted(reports)) + "\n")
else:
    sys.exit("unknown task type " + kind)
