#!/usr/bin/env python3
"""trainctl's image-folder input pipeline against torchvision's DataLoader, side by side.

  image_pipeline.py FOLDER [--workers 2] [--batch 128] [--batches 40] [--runs 3] [--trainctl PATH]

FOLDER holds train/ (and test/) class folders (bench/make_image_folder.py). For each split's
transforms, alternating runs:
  - torchvision 0.14 (Debian's python3-torchvision): ImageFolder with RandomResizedCrop(224),
    RandomHorizontalFlip, ToTensor, Normalize for training; Resize(256), CenterCrop(224),
    ToTensor, Normalize for the test; DataLoader(batch_size, num_workers=--workers, shuffle),
    iterated for --batches batches after one batch of warm-up (its workers started);
  - `trainctl pipeline` of a spec with the same transforms (data.augment.random_resized_crop and
    flip; crop_pct 0.875), --threads --workers decode threads, the same batches.
Prints images/s of each, per core of the CPUs both use (--workers), and the ratio; with --json
one object. The decode threads of trainctl and the DataLoader's worker processes are the same
number; each runs on the same cores.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def torchvision_rate(folder, split, workers, batch, batches):
    import torch
    import torchvision.datasets as D
    import torchvision.transforms as T
    norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    if split == "train":
        tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    else:
        tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), norm])
    data = D.ImageFolder(os.path.join(folder, split), tf)
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, num_workers=workers,
                                         drop_last=True, persistent_workers=workers > 0)
    def forever():  # epoch after epoch, as training reads it
        while True:
            yield from loader
    it = forever()
    next(it)  # its workers started, their first batches under way
    start = time.perf_counter()
    n = 0
    for _ in range(batches):
        x, _ = next(it)
        n += x.shape[0]
    return n / (time.perf_counter() - start)


def trainctl_rate(trainctl, folder, split, workers, batch, batches):
    with tempfile.TemporaryDirectory() as tmp:
        spec = os.path.join(tmp, "spec.yaml")
        with open(spec, "w") as f:
            f.write("name: pipeline\ntrainer:\n  model: resnet50\n  batch_size: %d\n  data:\n"
                    "    dataset: imagefolder\n    dir: %s\n    test_dir: %s\n    shape: [3, 224, 224]\n"
                    "    load: stream\n    augment: {random_resized_crop: true, flip: true}\n" %
                    (batch, os.path.abspath(os.path.join(folder, "train")), os.path.abspath(os.path.join(folder, "test"))))
        # The verb times its batches after one of warm-up, as the DataLoader's here.
        out = subprocess.run([trainctl, "pipeline", spec, "--split", split, "--threads", str(workers),
                              "--batches", str(batches), "-o", "json"],
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out)


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("folder")
    a.add_argument("--workers", type=int, default=2)
    a.add_argument("--batch", type=int, default=128)
    a.add_argument("--batches", type=int, default=40)
    a.add_argument("--runs", type=int, default=3)
    a.add_argument("--trainctl", default=os.path.join(os.path.dirname(__file__), "..", "build", "src", "trainctl"))
    a.add_argument("--json", action="store_true")
    o = a.parse_args()
    results = {}
    for split in ("train", "test"):
        if not os.path.isdir(os.path.join(o.folder, split)):
            continue
        ours, peer = [], []
        for _ in range(o.runs):
            ours.append(trainctl_rate(o.trainctl, o.folder, split, o.workers, o.batch, o.batches)["images_per_s"])
            peer.append(torchvision_rate(o.folder, split, o.workers, o.batch, o.batches))
        best_ours, best_peer = max(ours), max(peer)
        results[split] = {"trainctl_images_per_s": ours, "torchvision_images_per_s": peer,
                          "trainctl_per_core": best_ours / o.workers, "torchvision_per_core": best_peer / o.workers,
                          "ratio": best_ours / best_peer}
        if not o.json:
            print("%s: trainctl %s images/s, torchvision %s images/s (best per core: %.0f vs %.0f): %.2fx" %
                  (split, ", ".join("%.0f" % r for r in ours), ", ".join("%.0f" % r for r in peer),
                   best_ours / o.workers, best_peer / o.workers, best_ours / best_peer))
    if o.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
