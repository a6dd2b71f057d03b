#!/usr/bin/env python3
"""ResNet-50's first steps on pictures under one recipe: trainctl's built-in resnet50 against
torchvision's resnet50 in PyTorch, side by side in one run (issue 75: "ResNet-50 diverged").

  resnet50_recipe.py [--folder DIR] [--size 64] [--batch 16] [--steps 100] [--lr 0.01]
                     [--momentum 0.9] [--weight-decay 0] [--warmup 0] [--threads 2]
                     [--test-folder DIR] [--device cpu|cuda] [--loaders N] [--trainctl PATH]

The same folder of class folders (default: the shipped examples/fashion-jpegs/train, 600
pictures in 10 classes), the same views (RandomResizedCrop(size), a flip; grey pictures as 3
channels), SGD with the same learning rate, momentum and linear warm-up, the same batch, one
worker of --threads threads each. Prints the mean training loss of every 10 steps of each, so a
recipe that diverges is seen to diverge in both or in one only. With --test-folder, each model is
then evaluated on that folder's pictures (Resize(size / 0.875), CenterCrop(size): both sides' test
view) and the accuracy printed. --device cuda trains both on the GPU, --loaders N gives each side
N decoding processes (torchvision's DataLoader workers) or threads (trainctl's data.threads).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def torchvision_losses(a):
    import torch
    import torchvision
    import torchvision.transforms as T
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    # ImageFolder's loader brings every picture to RGB (a grey one as 3 equal channels).
    norm = T.Normalize([0.5] * 3, [0.25] * 3)
    tf = T.Compose([T.RandomResizedCrop(a.size), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    data = torchvision.datasets.ImageFolder(a.folder, tf)
    gpu = a.device == 'cuda'
    loader = torch.utils.data.DataLoader(data, batch_size=a.batch, shuffle=True, drop_last=True,
                                         num_workers=a.loaders, pin_memory=gpu, persistent_workers=a.loaders > 0)
    model = torchvision.models.resnet50(num_classes=len(data.classes)).to(a.device)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay)
    model.train()
    step, window, out = 0, [], []
    while step < a.steps:
        for x, y in loader:
            x, y = x.to(a.device, non_blocking=True), y.to(a.device, non_blocking=True)
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
    if not a.test_folder:
        return out, None
    test_tf = T.Compose([T.Resize(int(a.size / 0.875)), T.CenterCrop(a.size), T.ToTensor(), norm])
    test = torchvision.datasets.ImageFolder(a.test_folder, test_tf)
    if test.classes != data.classes:
        sys.exit('resnet50_recipe.py: the test folder has other classes than the training folder')
    right = total = 0
    model.eval()
    with torch.no_grad():
        for x, y in torch.utils.data.DataLoader(test, batch_size=64, num_workers=a.loaders):
            right += (model(x.to(a.device)).argmax(1).cpu() == y).sum().item()
            total += len(y)
    return out, (right / total, total)


def trainctl_losses(a):
    with tempfile.TemporaryDirectory() as tmp:
        spec = os.path.join(tmp, 'job.yaml')
        schedule = f'  schedule: {{name: constant, warmup_steps: {a.warmup}}}\n' if a.warmup else ''
        test = f', test_dir: {a.test_folder}' if a.test_folder else ''
        loaders = a.loaders or 1
        with open(spec, 'w') as f:
            f.write(f'name: r50-recipe\nprocs_per_node: 1\noutput_dir: {tmp}/out\ntrainer:\n  model: resnet50\n'
                    f'  batch_size: {a.batch}\n  epochs: 1000\n  max_steps: {a.steps}\n  log_every: 10\n'
                    f'  eval: {"true" if a.test_folder else "false"}\n  eval_every: 100000\n'
                    f'  threads: {a.threads}\n  device: {a.device}\n'
                    f'  optimizer: {{name: sgd, lr: {a.lr}, momentum: {a.momentum}, weight_decay: {a.weight_decay}}}\n'
                    f'{schedule}'
                    f'  data: {{dataset: imagefolder, dir: {a.folder}{test}, shape: [3, {a.size}, {a.size}], '
                    f'load: stream, threads: {loaders}, augment: {{random_resized_crop: true, flip: true}}}}\n')
        env = dict(os.environ, TRAINCTL_STATE_DIR=os.path.join(tmp, 'state'))
        subprocess.run([a.trainctl, 'run', spec], check=True, env=env, stdout=subprocess.DEVNULL)
        # Records every 10 steps and at each epoch's end: each record's steps into its 10 steps.
        sums, counts, accuracy = {}, {}, None
        with open(os.path.join(tmp, 'out', 'metrics.jsonl')) as f:
            for line in f:
                r = json.loads(line)
                if 'test_accuracy' in r:
                    accuracy = (r['test_accuracy'], r.get('test_images'))
                if 'loss' in r and 'window_steps' in r:
                    k = (int(r['step']) - 1) // 10
                    sums[k] = sums.get(k, 0.0) + r['loss'] * r['window_steps']
                    counts[k] = counts.get(k, 0) + r['window_steps']
        return [sums[k] / counts[k] for k in sorted(sums)], accuracy


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--folder', default=os.path.join(HERE, '..', 'examples', 'fashion-jpegs', 'train'))
    p.add_argument('--size', type=int, default=64)
    p.add_argument('--batch', type=int, default=16)
    p.add_argument('--steps', type=int, default=100)
    p.add_argument('--lr', type=float, default=0.01)
    p.add_argument('--momentum', type=float, default=0.9)
    p.add_argument('--weight-decay', type=float, default=0.0)
    p.add_argument('--warmup', type=int, default=0)
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--test-folder')
    p.add_argument('--device', choices=['cpu', 'cuda'], default='cpu')
    p.add_argument('--loaders', type=int, default=0)
    p.add_argument('--trainctl', default=os.path.join(HERE, '..', 'build', 'src', 'trainctl'))
    a = p.parse_args()
    a.folder = os.path.abspath(a.folder)
    if a.test_folder:
        a.test_folder = os.path.abspath(a.test_folder)
    runs = []
    for name, train in (('trainctl', trainctl_losses), ('torchvision', torchvision_losses)):
        start = time.monotonic()
        losses, accuracy = train(a)
        runs.append((name, losses, accuracy, time.monotonic() - start))
    print(f'mean loss of each 10 steps, lr {a.lr}, momentum {a.momentum}, weight decay {a.weight_decay}, '
          f'warm-up {a.warmup}, batch {a.batch}, {a.size}x{a.size}, {a.steps} steps on {a.device}')
    for name, losses, _, _ in runs:
        print(f'{name:<12}' + ' '.join(f'{x:6.2f}' for x in losses))
    for name, _, accuracy, seconds in runs:
        tested = ''
        if accuracy:
            tested = f'test accuracy {accuracy[0]:.4f}' + (f' ({accuracy[1]} pictures)' if accuracy[1] else '') + ', '
        print(f'{name:<12}{tested}{seconds:.0f} s in all')


if __name__ == '__main__':
    sys.exit(main())
