#!/usr/bin/env python3
"""ResNet-50's first steps on pictures under one recipe: trainctl's built-in resnet50 against
torchvision's resnet50 in PyTorch, side by side in one run (issue 75: "ResNet-50 diverged").

  resnet50_recipe.py [--folder DIR] [--size 64] [--batch 16] [--steps 100] [--lr 0.01]
                     [--momentum 0.9] [--warmup 0] [--threads 2] [--trainctl PATH]

The same folder of class folders (default: the shipped examples/fashion-jpegs/train, 600
pictures in 10 classes), the same views (RandomResizedCrop(size), a flip; grey pictures as 3
channels), SGD with the same learning rate, momentum and linear warm-up, the same batch, one
worker of --threads threads each. Prints the mean training loss of every 10 steps of each, so a
recipe that diverges is seen to diverge in both or in one only.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def torchvision_losses(a):
    import torch
    import torchvision
    import torchvision.transforms as T
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    tf = T.Compose([T.RandomResizedCrop(a.size), T.RandomHorizontalFlip(), T.Grayscale(3), T.ToTensor(),
                    T.Normalize([0.5] * 3, [0.25] * 3)])
    data = torchvision.datasets.ImageFolder(a.folder, tf)
    loader = torch.utils.data.DataLoader(data, batch_size=a.batch, shuffle=True, drop_last=True)
    model = torchvision.models.resnet50(num_classes=len(data.classes))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    model.train()
    step, window, out = 0, [], []
    while step < a.steps:
        for x, y in loader:
            for g in opt.param_groups:
                g['lr'] = a.lr * min(1.0, (step + 1) / a.warmup) if a.warmup else a.lr
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            window.append(loss.item())
            if step % 10 == 0:
                out.append(sum(window) / len(window))
                window = []
            if step == a.steps:
                break
    return out


def trainctl_losses(a):
    with tempfile.TemporaryDirectory() as tmp:
        spec = os.path.join(tmp, 'job.yaml')
        schedule = f'  schedule: {{name: constant, warmup_steps: {a.warmup}}}\n' if a.warmup else ''
        with open(spec, 'w') as f:
            f.write(f'name: r50-recipe\nprocs_per_node: 1\noutput_dir: {tmp}/out\ntrainer:\n  model: resnet50\n'
                    f'  batch_size: {a.batch}\n  epochs: 1000\n  max_steps: {a.steps}\n  log_every: 10\n'
                    f'  eval: false\n  threads: {a.threads}\n'
                    f'  optimizer: {{name: sgd, lr: {a.lr}, momentum: {a.momentum}}}\n{schedule}'
                    f'  data: {{dataset: imagefolder, dir: {a.folder}, shape: [3, {a.size}, {a.size}], '
                    f'load: stream, threads: 1, augment: {{random_resized_crop: true, flip: true}}}}\n')
        env = dict(os.environ, TRAINCTL_STATE_DIR=os.path.join(tmp, 'state'))
        subprocess.run([a.trainctl, 'run', spec], check=True, env=env, stdout=subprocess.DEVNULL)
        # Records every 10 steps and at each epoch's end: each record's steps into its 10 steps.
        sums, counts = {}, {}
        with open(os.path.join(tmp, 'out', 'metrics.jsonl')) as f:
            for line in f:
                r = json.loads(line)
                if 'loss' in r and 'window_steps' in r:
                    k = (int(r['step']) - 1) // 10
                    sums[k] = sums.get(k, 0.0) + r['loss'] * r['window_steps']
                    counts[k] = counts.get(k, 0) + r['window_steps']
        return [sums[k] / counts[k] for k in sorted(sums)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--folder', default=os.path.join(HERE, '..', 'examples', 'fashion-jpegs', 'train'))
    p.add_argument('--size', type=int, default=64)
    p.add_argument('--batch', type=int, default=16)
    p.add_argument('--steps', type=int, default=100)
    p.add_argument('--lr', type=float, default=0.01)
    p.add_argument('--momentum', type=float, default=0.9)
    p.add_argument('--warmup', type=int, default=0)
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--trainctl', default=os.path.join(HERE, '..', 'build', 'src', 'trainctl'))
    a = p.parse_args()
    a.folder = os.path.abspath(a.folder)
    ours = trainctl_losses(a)
    theirs = torchvision_losses(a)
    print(f'mean loss of each 10 steps, lr {a.lr}, momentum {a.momentum}, warm-up {a.warmup}, batch {a.batch}, '
          f'{a.size}x{a.size}')
    print('trainctl    ' + ' '.join(f'{x:6.2f}' for x in ours))
    print('torchvision ' + ' '.join(f'{x:6.2f}' for x in theirs))


if __name__ == '__main__':
    sys.exit(main())
