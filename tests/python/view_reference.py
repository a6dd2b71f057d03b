"""What torchvision's transforms make of pictures, for trainctl's image-view tests.

  view_reference.py DIR
Reads DIR/cases.json: a list of {"file": NAME, "size": [rows, cols], "crop_pct": F} (the centre
view: Resize(int(rows / crop_pct)) then CenterCrop) or {"file", "size", "box": [i, j, h, w]}
(F.resized_crop, as RandomResizedCrop applies its box), and writes each result's RGB bytes,
planar (C, H, W) as trainctl holds them, to DIR/NAME.<index>.raw.
"""
import json
import os
import sys

import numpy as np
import torchvision.transforms as T
import torchvision.transforms.functional as F
from PIL import Image


def main():
    out = sys.argv[1]
    cases = json.load(open(os.path.join(out, "cases.json")))
    for k, case in enumerate(cases):
        img = Image.open(os.path.join(out, case["file"])).convert("RGB")
        rows, cols = case["size"]
        if "box" in case:
            i, j, h, w = case["box"]
            res = F.resized_crop(img, i, j, h, w, [rows, cols], interpolation=T.InterpolationMode.BILINEAR)
        else:
            res = T.Compose([T.Resize(int(rows / case["crop_pct"])), T.CenterCrop((rows, cols))])(img)
        planar = np.asarray(res, dtype=np.uint8).transpose(2, 0, 1).copy()
        planar.tofile(os.path.join(out, "%s.%d.raw" % (case["file"], k)))


if __name__ == "__main__":
    main()
