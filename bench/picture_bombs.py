#!/usr/bin/python3
"""Hostile pictures against trainctl's decoders (issue 71), with the real binary:

  1. scan bombs: progressive JPEGs whose last scan is repeated 2000 times (8192x8192, as the red
     team made it, and 2048x2048, whose coefficients fit the decoder's budget), streamed by
     `trainctl pipeline` and looked at by `trainctl validate` (which decodes the first picture
     whole): the wall time of each
  2. memory bombs: a folder of eight 8192x8192 RGB PNGs of zeros (some 200 KB each), and one of
     eight 17-byte PPM headers `P6 8192 8192 255`, streamed with --threads 8: peak resident memory
     of the process (its rusage), beside a folder of eight 64x64 pictures (the floor)

Prints markdown for bench/RESULTS.md. Usage: /usr/bin/python3 bench/picture_bombs.py [--trainctl PATH] (Debian's Python: it has PIL)
"""
import argparse, io, os, struct, subprocess, sys, tempfile, time, zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def scan_bomb(side, repeats):
    from PIL import Image
    buf = io.BytesIO()  # a smooth picture: small scans, as the red team's 638 KB file
    Image.linear_gradient("L").resize((side, side)).convert("RGB").save(buf, "JPEG", quality=90, progressive=True)
    b = buf.getvalue()
    last = b.rfind(b"\xff\xda")
    scan = b[last:-2]
    return b[:-2] + scan * repeats + b"\xff\xd9"


def zero_png(side):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    z = zlib.compressobj(9)
    row = b"\0" * (side * 3 + 1)
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def folder(root, name, files):
    """Two class folders holding `files` (name -> bytes) between them, and a spec streaming them."""
    d = os.path.join(root, name)
    for i, (fname, data) in enumerate(files.items()):
        cls = os.path.join(d, "ab"[i % 2])
        os.makedirs(cls, exist_ok=True)
        open(os.path.join(cls, fname), "wb").write(data)
    spec = os.path.join(root, name + ".yaml")
    open(spec, "w").write(f"name: {name}\ntrainer:\n  model: cnn\n  data:\n    dataset: imagefolder\n"
                          f"    dir: {d}\n    shape: [3, 224, 224]\n    load: stream\n  batch_size: 8\n")
    return d, spec


def run(cmd, env):
    """Wall time, the command's own peak resident memory (VmHWM, sampled every 10 ms: a child's
    rusage would carry this process's peak across fork and exec), exit code, output."""
    start = time.monotonic()
    out = tempfile.TemporaryFile()
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    peak = 0
    while p.poll() is None:
        try:
            for line in open(f"/proc/{p.pid}/status"):
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.01)
    out.seek(0)
    return time.monotonic() - start, peak // 1024, p.returncode, out.read().decode(errors="replace")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainctl", default=os.path.join(ROOT, "build/src/trainctl"))
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="trainctl-bombs-")
    env = dict(os.environ, XDG_CACHE_HOME=os.path.join(root, "cache"))
    rows = []
    from PIL import Image
    small = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 20, 30)).save(small, "PNG")
    cases = [
        ("eight 64x64 PNGs (the floor)", {f"{i}.png": small.getvalue() for i in range(8)}),
        ("eight 8192x8192 RGB PNGs of zeros", {f"{i}.png": zero_png(8192) for i in range(8)}),
        ("eight 17-byte PPMs `P6 8192 8192 255`", {f"{i}.ppm": b"P6 8192 8192 255\n" for i in range(8)}),
        ("8192x8192 progressive JPEG, last scan x2000", {"bomb.jpg": scan_bomb(8192, 2000), "ok.png": small.getvalue()}),
        ("2048x2048 progressive JPEG, last scan x2000", {"bomb.jpg": scan_bomb(2048, 2000), "ok.png": small.getvalue()}),
    ]
    for label, files in cases:
        d, spec = folder(root, label.split()[0] + str(len(rows)), files)
        size = sum(len(b) for b in files.values())
        secs, mib, code, out = run([a.trainctl, "pipeline", spec, "--threads", "8", "--batches", "1"], env)
        skipped = next((l for l in out.splitlines() if "skipped" in l or "error" in l), "")
        rows.append((label, f"{size / 1e3:.0f} KB", "pipeline --threads 8", f"{secs:.2f} s", f"{mib} MiB", code,
                     skipped[:110]))
        if "JPEG" in label:
            vspec = spec.replace(".yaml", "-noshape.yaml")
            open(vspec, "w").write(open(spec).read().replace("    shape: [3, 224, 224]\n", ""))
            secs, mib, code, out = run([a.trainctl, "validate", vspec], env)
            rows.append((label, f"{size / 1e3:.0f} KB", "validate (no shape)", f"{secs:.2f} s", f"{mib} MiB", code,
                         out.strip().splitlines()[-1][:110] if out.strip() else ""))
    print("| pictures | bytes | command | wall | peak RSS | exit | what it said |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(x).replace("|", "/") for x in r) + " |")


if __name__ == "__main__":
    main()
