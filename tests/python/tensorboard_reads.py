"""TensorBoard's own reading of a trainctl run, against the run's metrics.jsonl.

usage: tensorboard_reads.py RUN_OUTPUT_DIR PORT

Loads the run's event files with TensorBoard's EventAccumulator, then serves them with
`tensorboard --logdir` on 127.0.0.1:PORT and reads its scalars API over HTTP. Prints one line per
check and exits 1 if any series differs from metrics.jsonl (loss and lr per logged step, test
accuracy per epoch; floats as the event files store them, 32 bits).
"""
import json
import os
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request

from tensorboard.backend.event_processing import event_accumulator


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def main():
    out, port = sys.argv[1], int(sys.argv[2])
    logdir = os.path.join(out, "tensorboard")
    expected = {"train/loss": [], "train/lr": [], "test/accuracy": []}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "loss" in r:
                expected["train/loss"].append((int(r["step"]), f32(r["loss"])))
                expected["train/lr"].append((int(r["step"]), f32(r["lr"])))
            if "test_accuracy" in r:
                expected["test/accuracy"].append((int(r["step"]), f32(r["test_accuracy"])))
    failed = False

    acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    for tag, want in expected.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []
        ok = got == want and len(want) > 0
        failed |= not ok
        print(f"reader {tag}: {len(got)} points {'equal' if ok else 'DIFFER'} ({got[:3]} vs {want[:3]})")

    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port),
         "--reload_interval", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 90
        runs = None
        while time.time() < deadline:
            try:
                runs = json.load(urllib.request.urlopen(base + "/data/runs", timeout=5))
                if runs:
                    break
            except OSError:
                pass
            if server.poll() is not None:
                break
            time.sleep(0.5)
        if not runs:
            print("tensorboard did not serve the run:", server.stderr.read().decode()[-2000:] if server.poll() is not None else "")
            return 1
        print("tensorboard --logdir serves runs", runs)
        for tag, want in expected.items():
            q = urllib.parse.urlencode({"run": runs[0], "tag": tag})
            points = json.load(urllib.request.urlopen(f"{base}/data/plugin/scalars/scalars?{q}", timeout=30))
            got = [(int(step), f32(value)) for _, step, value in points]
            ok = got == want
            failed |= not ok
            print(f"http {tag}: {len(got)} points {'equal' if ok else 'DIFFER'}")
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
