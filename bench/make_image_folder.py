#!/usr/bin/env python3
"""Makes an ImageNet-like folder of JPEGs from real photographs shipped in Debian packages.

  make_image_folder.py OUT --files 20000 --classes 100 [--links 10] [--test 2000] [--seed 0]
  make_image_folder.py OUT --by-source --files 5000 --test 1000     (a task that can be learnt)
  make_image_folder.py --save-sources DIR                           (for a machine without them)

The photographs are the wallpapers of Debian's mate-backgrounds and ukui-wallpapers packages
(apt-get install mate-backgrounds ukui-wallpapers), and any other JPEG or PNG of at least
1000 pixels a side under /usr/share/backgrounds. Each file is a random crop of one of them,
rescaled to ImageNet's size statistics (about 400 x 350 on average: the longer side 250 to 500,
aspect ratio 3:4 to 4:3, either way) and saved at JPEG quality 75 to 95, in class folder
OUT/train/cNNNN (OUT/test/cNNNN for --test files). With --links K, the training files are linked
again K - 1 times under other names (OUT/train-xK): the same pictures, K times the files, for
measuring what the number of files costs.

The classes above are drawn at random: such a folder measures the input pipeline, but nothing
can learn it. With --by-source the class of a file is the photograph it was cropped from (class
folders named after the photographs' files; a photograph that looks like an earlier one at 16 x 16
pixels, as another's copy at another size does, is left out), so a network learns to tell the photographs apart from crops it has not seen: the test
files are other crops of the same photographs. --sources DIR reads the photographs from DIR
instead of /usr/share/backgrounds; --save-sources DIR writes them there (as they are used, at most
1600 pixels a side) for a machine that lacks the packages.
"""
import argparse
import glob
import os
import random
import sys

from PIL import Image


def sources(root, min_side):
    """(name, picture) of each photograph under root, in path order."""
    paths = []
    for pattern in ("**/*.jpg", "**/*.jpeg", "**/*.png"):
        paths += glob.glob(os.path.join(root, pattern), recursive=True)
    pictures = []
    for p in sorted(set(paths)):
        try:
            img = Image.open(p)
            if min(img.size) < min_side:
                continue
            img = img.convert("RGB")
            img.thumbnail((1600, 1600))  # detail enough for crops down to 250 pixels
            pictures.append((os.path.splitext(os.path.relpath(p, root))[0].replace(os.sep, "-"), img))
        except OSError:
            continue
    return pictures


def distinct(pictures):
    """The pictures less those that are an earlier one at another size (a 16 x 16 grey thumbnail
    within a few levels of it)."""
    kept, marks = [], []
    for name, img in pictures:
        mark = list(img.convert("L").resize((16, 16), Image.BILINEAR).getdata())
        if not any(sum(abs(a - b) for a, b in zip(mark, m)) < 4 * 256 for m in marks):
            kept.append((name, img))
            marks.append(mark)
    return kept


def write(src, rng, path):
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
    a.add_argument("out", nargs="?")
    a.add_argument("--by-source", action="store_true", help="a file's class is its photograph")
    a.add_argument("--sources", default="/usr/share/backgrounds")
    a.add_argument("--save-sources", metavar="DIR")
    a.add_argument("--files", type=int, default=20000)
    a.add_argument("--classes", type=int, default=100)
    a.add_argument("--test", type=int, default=0)
    a.add_argument("--links", type=int, default=1)
    a.add_argument("--seed", type=int, default=0)
    o = a.parse_args()
    pictures = sources(o.sources, 1000)
    if len(pictures) < 10:
        sys.exit("make_image_folder.py: fewer than 10 photographs under %s; "
                 "apt-get install mate-backgrounds ukui-wallpapers" % o.sources)
    if o.save_sources:
        os.makedirs(o.save_sources, exist_ok=True)
        for name, img in pictures:
            img.save(os.path.join(o.save_sources, name + ".jpg"), quality=92)
        print("%s: %d photographs" % (o.save_sources, len(pictures)))
        return
    if not o.out:
        a.error("OUT is needed (or --save-sources)")
    if o.by_source:
        pictures = distinct(pictures)
        o.classes = len(pictures)
    rng = random.Random(o.seed)
    for split, count in (("train", o.files), ("test", o.test)):
        for i in range(count):
            if o.by_source:
                cls, src = pictures[i % len(pictures)]
            else:
                cls, src = "c%04d" % (i % o.classes), rng.choice(pictures)[1]
            d = os.path.join(o.out, split, cls)
            os.makedirs(d, exist_ok=True)
            write(src, rng, os.path.join(d, "%07d.jpg" % i))
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
