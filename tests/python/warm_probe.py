"""What a worker sees of its own process, written to $PROBE_DIR/probe-RANK-RESTART.json: a worker
forked from a warm interpreter (preload) must see what a fresh interpreter sees.

argv[1]: probe (write it), raise (an uncaught exception), exit3 (sys.exit(3)), sigint (an
uncaught KeyboardInterrupt), fail-once (rank 1 exits 1 in the first attempt, after writing)."""
import sys

preloaded = "xml.dom.minidom" in sys.modules  # the tests preload it; this script never imports it
import ctypes
import json
import os
import signal

mode = sys.argv[1]
with open(os.path.join(os.environ["PROBE_DIR"], "started-" + os.environ["RANK"]), "w") as f:
    f.write("preloaded" if preloaded else "fresh")
if mode == "raise":
    raise ValueError("a worker's own error")
if mode == "exit3":
    sys.exit(3)
if mode == "sigint":
    os.kill(os.getpid(), signal.SIGINT)
    signal.pause()

import torch

main = sys.modules["__main__"]


def read(path):
    with open(path, "rb") as f:
        return f.read()


def fds():
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue  # the listing's own descriptor, closed
        out[fd] = target.split(":[")[0].replace("/proc/%d/" % os.getpid(), "/proc/self/")
    return out


def stream(s):
    return {"tty": s.isatty(), "line_buffering": s.line_buffering, "write_through": s.write_through,
            "encoding": s.encoding, "errors": s.errors, "fd": s.fileno()}


libc = ctypes.CDLL(None, use_errno=True)
deathsig = ctypes.c_int(0)
libc.prctl(2, ctypes.byref(deathsig), 0, 0, 0)  # PR_GET_PDEATHSIG
parent = os.getppid()
siblings = []  # the node's warm interpreter, if there is one: the agent's child too
for pid in os.listdir("/proc"):
    try:
        if pid.isdigit() and b"(trainctl warm interpreter" in read("/proc/%s/cmdline" % pid) and \
                os.stat("/proc/" + pid).st_uid == os.getuid() and \
                read("/proc/%s/stat" % pid).rsplit(b")", 1)[1].split()[1] == str(parent).encode():
            siblings.append(int(pid))
    except OSError:
        pass
env_keys = sorted(os.environ)
probe = {
    "preloaded": preloaded,
    "warm_interpreters": siblings,
    "argv": sys.argv, "orig_argv": sys.orig_argv, "path": sys.path, "executable": sys.executable,
    "file": __file__, "name": __name__, "main": sorted(vars(main)), "loader": type(main.__loader__).__name__,
    "spec": main.__spec__, "package": main.__package__, "cached": main.__cached__,
    "cwd": os.getcwd(), "env_keys": env_keys,
    "env": {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "FOO", "OMP_NUM_THREADS", "PYTHONUNBUFFERED")},
    "proc_environ_is_environ": sorted(e for e in read("/proc/self/environ").decode().split("\0") if e) ==
                               sorted(k + "=" + v for k, v in os.environ.items()),
    "proc_cmdline": read("/proc/self/cmdline").decode().split("\0")[:-1],
    "parent_exe": os.path.basename(os.readlink("/proc/%d/exe" % parent)),
    "leads_group": os.getpgid(0) == os.getpid(), "parent_session": os.getsid(0) == os.getsid(parent),
    "death_signal": deathsig.value,
    "signals": {int(s): str(signal.getsignal(s)) for s in signal.valid_signals()
                if s not in (signal.SIGKILL, signal.SIGSTOP) and s < signal.SIGRTMIN},
    "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "flags": str(sys.flags), "stdout": stream(sys.stdout), "stderr": stream(sys.stderr),
    "stdin": os.readlink("/proc/self/fd/0"), "fds": fds(),
    "cpus": sorted(os.sched_getaffinity(0)), "umask": os.umask(0o22),
    "torch_seed": torch.initial_seed(), "torch_rand": torch.rand(3).tolist(), "threads": torch.get_num_threads(),
}
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
path = os.path.join(os.environ["PROBE_DIR"], "probe-%s-%s.json" % (os.environ["RANK"], restart))
with open(path + ".part", "w") as f:  # whole or not at all: a peer's failure may stop this worker
    json.dump(probe, f, indent=1, sort_keys=True)
os.replace(path + ".part", path)
print("probe written", flush=True)
if mode == "fail-once" and os.environ["RANK"] == "1" and restart == "0":
    # The failure once rank 0 has written its probe too: the restart it causes stops rank 0, which
    # on a loaded machine may still be importing torch.
    import time
    first = os.path.join(os.environ["PROBE_DIR"], "probe-0-0.json")
    for _ in range(1200):
        if os.path.exists(first):
            break
        time.sleep(0.05)
    sys.exit(1)
