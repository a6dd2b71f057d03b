"""Writes TorchScript modules for trainctl's tests, and what PyTorch computes with them.

  scripted_models.py OUTDIR
For each model (a batch-norm CNN and a small ResNet on 1x28x28 images, 10 classes) writes
OUTDIR/NAME.pt (torch.jit.script(model).save) and OUTDIR/NAME.json: its parameters' names, and on
a fixed batch in training mode the cross-entropy loss and each parameter's gradient sum.
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = nn.Sequential()
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.downsample(x))


class SmallResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2))
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer1(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def bn_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.MaxPool2d(2), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 48, 3, stride=2, padding=1), nn.BatchNorm2d(48), nn.ReLU(),
        nn.Conv2d(48, 96, 3, stride=2, padding=1), nn.BatchNorm2d(96), nn.ReLU(),
        nn.Dropout(0.0), nn.Flatten(), nn.Linear(96 * 4 * 4, 10))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 8 * 28 * 28).reshape(8, 1, 28, 28)
    y = torch.arange(8) % 10
    for name, model in (("bn_cnn", bn_cnn()), ("resnet", SmallResNet())):
        model.train()
        torch.jit.script(model).save(os.path.join(out, name + ".pt"))
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        json.dump({"names": [n for n, _ in model.named_parameters()],
                   "buffers": [n for n, _ in model.named_buffers()],
                   "loss": loss.item(),
                   "grad_sums": [p.grad.double().sum().item() for _, p in model.named_parameters()]},
                  open(os.path.join(out, name + ".json"), "w"))


if __name__ == "__main__":
    main()
