#!/usr/bin/env python3
"""Writes this folder's pictures: Fashion-MNIST images (Debian's dataset-fashion-mnist) as JPEG
files in a folder per class, as photographs come: train/<class>/NNNNN.jpg (the first 60 of each
class in the training set) and test/<class>/NNNNN.jpg (the first 20 of each in the test set),
each upscaled to a size of its own (28 to 56 pixels a side) so that the spec's view resizes and
crops them as it would photographs. Run from anywhere: python3 make.py
"""
import gzip
import os
import random

from PIL import Image

SRC = "/usr/share/datasets/fashion-mnist"
CLASSES = ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle_boot"]


def read(split):
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(os.path.join(SRC, prefix + "-images-idx3-ubyte.gz")) as f:
        images = f.read()[16:]
    with gzip.open(os.path.join(SRC, prefix + "-labels-idx1-ubyte.gz")) as f:
        labels = f.read()[8:]
    return images, labels


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    rng = random.Random(0)
    for split, per_class in (("train", 60), ("test", 20)):
        images, labels = read(split)
        taken = [0] * 10
        for i, label in enumerate(labels):
            if taken[label] == per_class:
                continue
            taken[label] += 1
            img = Image.frombytes("L", (28, 28), images[i * 784:(i + 1) * 784])
            side = rng.randint(28, 56)
            img = img.resize((side, side), Image.BILINEAR)
            d = os.path.join(here, split, CLASSES[label])
            os.makedirs(d, exist_ok=True)
            img.save(os.path.join(d, "%05d.jpg" % i), quality=90)
            if min(taken) == per_class:
                break


if __name__ == "__main__":
    main()
