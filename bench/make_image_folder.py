#!/usr/bin/env python3
"""Makes an ImageNet-like folder of JPEGs from real photographs shipped in Debian packages.

  make_image_folder.py OUT --files 20000 --classes 100 [--links 10] [--test 2000] [--seed 0]

The photographs are the wallpapers of Debian's mate-backgrounds and ukui-wallpapers packages
(apt-get install mate-backgrounds ukui-wallpapers), and any other JPEG or PNG of at least
1000 pixels a side under /usr/share/backgrounds. Each file is a random crop of one of them,
rescaled to ImageNet's size statistics (about 400 x 350 on average: the longer side 250 to 500,
aspect ratio 3:4 to 4:3, either way) and saved at JPEG quality 75 to 95, in class folder
OUT/train/cNNNN (OUT/test/cNNNN for --test files). With --links K, the training files are linked
again K - 1 times under other names (OUT/train-xK): the same pictures, K times the files, for
measuring what the number of files costs.
"""
import argparse
import glob
import os
import random
import sys

from PIL import Image


def sources(min_side):
    paths = []
    for pattern in ("/usr/share/backgrounds/**/*.jpg", "/usr/share/backgrounds/**/*.jpeg",
                    "/usr/share/backgrounds/**/*.png"):
        paths += glob.glob(pattern, recursive=True)
    pictures = []
    for p in sorted(set(paths)):
        try:
            img = Image.open(p)
            if min(img.size) < min_side:
                continue
            img = img.convert("RGB")
            img.thumbnail((1600, 1600))  # detail enough for crops down to 250 pixels
            pictures.append(img)
        except OSError:
            continue
    return pictures


def write(pictures, rng, path):
    src = rng.choice(pictures)
    longer = rng.randint(250, 500)
    ratio = rng.uniform(3 / 4, 4 / 3)
    w, h = (longer, int(longer / ratio)) if ratio >= 1 else (int(longer * ratio), longer)
    # A crop of the source of 30 to 100 % of its shorter side, at the picture's ratio.
    scale = rng.uniform(0.3, 1.0)
    cw = max(w, int(min(src.width, src.height * w / h) * scale))
    ch = max(h, int(cw * h / w))
    cw, ch = min(cw, src.width), min(ch, src.height)
    x, y = rng.randint(0, src.width - cw), rng.randint(0, src.height - ch)
    img = src.crop((x, y, x + cw, y + ch)).resize((w, h), Image.BILINEAR)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    img.save(path, quality=rng.randint(75, 95))


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("out")
    a.add_argument("--files", type=int, default=20000)
    a.add_argument("--classes", type=int, default=100)
    a.add_argument("--test", type=int, default=0)
    a.add_argument("--links", type=int, default=1)
    a.add_argument("--seed", type=int, default=0)
    o = a.parse_args()
    pictures = sources(1000)
    if len(pictures) < 10:
        sys.exit("make_image_folder.py: fewer than 10 photographs under /usr/share/backgrounds; "
                 "apt-get install mate-backgrounds ukui-wallpapers")
    rng = random.Random(o.seed)
    for split, count in (("train", o.files), ("test", o.test)):
        for i in range(count):
            cls = "c%04d" % (i % o.classes)
            d = os.path.join(o.out, split, cls)
            os.makedirs(d, exist_ok=True)
            write(pictures, rng, os.path.join(d, "%07d.jpg" % i))
    if o.links > 1:
        linked = os.path.join(o.out, "train-x%d" % o.links)
        for cls in sorted(os.listdir(os.path.join(o.out, "train"))):
            os.makedirs(os.path.join(linked, cls), exist_ok=True)
            for name in sorted(os.listdir(os.path.join(o.out, "train", cls))):
                for k in range(o.links):
                    os.link(os.path.join(o.out, "train", cls, name), os.path.join(linked, cls, "%d-%s" % (k, name)))
    print("%s: %d training and %d test pictures of %d photographs, %d classes" %
          (o.out, o.files, o.test, len(pictures), o.classes))


if __name__ == "__main__":
    main()
