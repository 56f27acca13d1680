#!/usr/bin/env python3
"""The ResNet example's training loop in PyTorch, single-process or with DistributedDataParallel.

The Python side of benchmarks/ddp_side_by_side.sh: the same networks as examples/resnet/models.cpp
(same layers, widths, stems and initialization), the same synthetic data shape, SGD with momentum
and weight decay, the same per-step work (a batch gathered from the dataset by index, forward,
cross-entropy, backward, step, the loss and accuracy read back), and the same throughput measure
(global images per second of the slowest rank, per epoch). With --ranks 2 it starts two processes
on this host that train with torch.distributed DDP over gloo, each on its shard of every epoch.

    python benchmarks/ddp_resnet.py --model resnet18 --image-size 64 --batch-size 32 --ranks 2

Across hosts (benchmarks/cluster/), one command per host, each with --ranks processes:
    python benchmarks/ddp_resnet.py --nodes 2 --node-rank R --master-addr HOST0 ...
(gloo picks its interface from the host name; set GLOO_SOCKET_IFNAME where that does not
resolve to the interface between the hosts).

Prints one line per epoch and a final line:
    RESULT impl=ddp ranks=2 model=resnet18 ... step_ms=<median> best_ms=<best> img_s=<median> epochs=<n>
where the median and the best are over the epochs after the first (which includes warm-up).
"""

import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def conv3x3(cin, cout, stride):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def conv1x1(cin, cout, stride):
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """examples/resnet BasicBlockImpl: zero-pad (option A) or projection (option B) shortcut."""

    def __init__(self, cin, cout, stride, projection):
        super().__init__()
        self.conv1 = conv3x3(cin, cout, stride)
        self.norm1 = nn.BatchNorm2d(cout)
        self.conv2 = conv3x3(cout, cout, 1)
        self.norm2 = nn.BatchNorm2d(cout)
        self.stride = stride
        self.pad = 0
        self.shortcut = None
        if stride != 1 or cin != cout:
            if projection:
                self.shortcut = nn.Sequential(conv1x1(cin, cout, stride), nn.BatchNorm2d(cout))
            else:
                self.pad = cout - cin

    def forward(self, x):
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        identity = x
        if self.shortcut is not None:
            identity = self.shortcut(x)
        elif self.stride != 1 or self.pad != 0:
            identity = x[:, :, :: self.stride, :: self.stride]
            front = self.pad // 2
            identity = F.pad(identity, (0, 0, 0, 0, front, self.pad - front))
        return F.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = conv1x1(cin, width, 1)
        self.norm1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride)
        self.norm2 = nn.BatchNorm2d(width)
        self.conv3 = conv1x1(width, cout, 1)
        self.norm3 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(conv1x1(cin, cout, stride), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.norm1(self.conv1(x)))
        out = F.relu(self.norm2(self.conv2(out)))
        out = self.norm3(self.conv3(out))
        return F.relu(out + (self.shortcut(x) if self.shortcut is not None else x))


def init_weights(model):
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")


def head():
    return [nn.AdaptiveAvgPool2d(1), nn.Flatten()]


def cifar_resnet(depth, in_channels, num_classes):
    n = (depth - 2) // 6
    layers = [conv3x3(in_channels, 16, 1), nn.BatchNorm2d(16), nn.ReLU()]
    channels = 16
    for width in (16, 32, 64):
        for i in range(n):
            layers.append(BasicBlock(channels, width, 2 if i == 0 and width != 16 else 1, False))
            channels = width
    model = nn.Sequential(nn.Sequential(*layers, *head()), nn.Linear(channels, num_classes))
    init_weights(model)
    return model


def imagenet_resnet(blocks, bottleneck, in_channels, num_classes, small_stem):
    if small_stem:
        layers = [conv3x3(in_channels, 64, 1), nn.BatchNorm2d(64), nn.ReLU()]
    else:
        layers = [nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False),
                  nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1)]
    channels, width = 64, 64
    for stage, count in enumerate(blocks):
        for i in range(count):
            stride = 2 if i == 0 and stage > 0 else 1
            if bottleneck:
                layers.append(Bottleneck(channels, width, stride))
                channels = width * Bottleneck.expansion
            else:
                layers.append(BasicBlock(channels, width, stride, True))
                channels = width
        width *= 2
    model = nn.Sequential(nn.Sequential(*layers, *head()), nn.Linear(channels, num_classes))
    init_weights(model)
    return model


def make_model(name, in_channels, num_classes, image_size, stem):
    imagenet = {"resnet18": ([2, 2, 2, 2], False), "resnet34": ([3, 4, 6, 3], False),
                "resnet50": ([3, 4, 6, 3], True)}
    if name in imagenet:
        # examples/resnet choose_stem(): auto takes the small stem for images of 32 px or less.
        small = stem == "small" or (stem == "auto" and image_size <= 32)
        return imagenet[name][0], imagenet_resnet(*imagenet[name], in_channels, num_classes, small), small
    depth = int(name.removeprefix("resnet"))
    return None, cifar_resnet(depth, in_channels, num_classes), None


def synthetic(samples, channels, size, classes, seed):
    """Learnable images like examples/resnet make_synthetic(): class prototype x 0.5 + noise."""
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(classes, channels, size, size, generator=g)
    labels = torch.randint(classes, (samples,), generator=g)
    images = prototypes.index_select(0, labels).mul_(0.5) + torch.randn(samples, channels, size, size, generator=g)
    return images, labels


def train(local_rank, world, args, port):
    rank = args.node_rank * args.ranks + local_rank
    torch.set_num_threads(args.threads)
    if world > 1:
        os.environ["MASTER_ADDR"] = args.master_addr
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(args.seed)  # the same initial weights on every rank, as broadcast would give
    _, model, small = make_model(args.model, 3, 10, args.image_size, args.stem)
    images, labels = synthetic(args.samples, 3, args.image_size, 10, args.seed)
    parameters = sum(p.numel() for p in model.parameters())
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)  # defaults: 25 MiB buckets
    sgd = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    if rank == 0:
        print(f"{'ddp' if world > 1 else 'python'}: {args.model}, {parameters} parameters, "
              f"{'CIFAR-style 3x3' if small is None else 'small' if small else 'standard'} stem, {world} ranks x batch {args.batch_size}, "
              f"{args.threads} threads per rank, {args.image_size} px, torch {torch.__version__}",
              flush=True)
    total_steps = args.epochs * args.steps
    rates = []
    for epoch in range(args.epochs):
        # DistributedSampler-like shard: a permutation fixed by (seed, epoch), every world-th item.
        order = torch.randperm(args.samples, generator=torch.Generator().manual_seed(args.seed + epoch))
        shard = order[rank::world]
        model.train()
        start = time.perf_counter()
        seen = 0
        for step in range(args.steps):
            index = shard[step * args.batch_size:(step + 1) * args.batch_size]
            x, y = images.index_select(0, index), labels.index_select(0, index)
            t = epoch * args.steps + step
            for group in sgd.param_groups:
                group["lr"] = 0.5 * args.lr * (1 + math.cos(math.pi * t / total_steps))
            sgd.zero_grad()
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
            sgd.step()
            loss.item()
            logits.detach().argmax(1).eq(y).sum().item()
            seen += y.numel()
        elapsed = torch.tensor([time.perf_counter() - start, float(seen)], dtype=torch.float64)
        if world > 1:
            slowest = elapsed[:1].clone()
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            total = elapsed[1:].clone()
            dist.all_reduce(total)
            elapsed = torch.cat([slowest, total])
        rate = elapsed[1].item() / elapsed[0].item()
        rates.append(rate)
        if rank == 0:
            print(f"epoch {epoch + 1:>3}/{args.epochs}  {rate:7.1f} img/s  {elapsed[0].item():6.1f} s", flush=True)
    if rank == 0:
        measured = rates[1:] if len(rates) > 1 else rates
        img_s = statistics.median(measured)
        step_ms = 1000.0 * args.batch_size * world / img_s
        print(f"RESULT impl={'ddp' if world > 1 else 'python'} ranks={world} model={args.model} "
              f"image={args.image_size} batch={args.batch_size} threads={args.threads} "
              f"step_ms={step_ms:.1f} best_ms={1000.0 * args.batch_size * world / max(measured):.1f} "
              f"img_s={img_s:.1f} epochs={len(measured)}", flush=True)
    if world > 1:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--stem", default="auto", choices=["auto", "standard", "small"])
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="steps per epoch")
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument("--ranks", type=int, default=1, help="processes on this host")
    parser.add_argument("--nodes", type=int, default=1, help="hosts, each running this script")
    parser.add_argument("--node-rank", type=int, default=0, help="this host's index")
    parser.add_argument("--master-addr", default="127.0.0.1", help="address of host 0")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--port", type=int, default=29511)
    args = parser.parse_args()
    world = args.nodes * args.ranks
    if not 0 <= args.node_rank < args.nodes:
        sys.exit(f"--node-rank {args.node_rank} is not within 0..{args.nodes - 1}")
    if args.samples < world * args.steps * args.batch_size:
        sys.exit(f"--samples {args.samples} is fewer than ranks x steps x batch")
    if args.ranks == 1:
        train(0, world, args, args.port)
    else:
        mp.spawn(train, args=(world, args, args.port), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
