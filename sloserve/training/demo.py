"""The demo training job: a small CNN in PyTorch on scikit-learn's digits (8x8 images, 10 classes).

Entry ``sloserve.training.demo:train``; config keys (all optional): ``iterations`` (default
2000; 0 = until cancelled), ``checkpoint_every`` (50), ``batch_size`` (64), ``lr`` (0.05),
``seed`` (0), ``channels`` (16), ``iteration_delay_s`` (0: extra time per iteration, to stand in
for a heavier model). Runs on the worker's CUDA GPU when it has one, else on the CPU; a gang of
N workers trains data-parallel (DDP), each on its own minibatches.

Minibatch ``i`` of rank ``r`` is drawn from ``Generator().manual_seed(seed, i, r)``, and the
checkpoint holds the model, the optimizer and the iteration, so a job resumed from the checkpoint
of iteration ``k`` computes what an uninterrupted one computes from ``k`` on: a preemption costs
only the iterations after the last checkpoint.
"""

from __future__ import annotations

import time
from typing import Any

from sloserve.training import session

DEFAULTS: dict[str, Any] = {
    "iterations": 2000,
    "checkpoint_every": 50,
    "batch_size": 64,
    "lr": 0.05,
    "seed": 0,
    "channels": 16,
    "iteration_delay_s": 0.0,
}


def check_config(config: dict) -> dict:
    """The config with defaults filled in; a ``ValueError`` names a bad key."""
    unknown = set(config) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown config keys {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    c = {**DEFAULTS, **config}
    for k in ("iterations", "checkpoint_every", "batch_size", "seed", "channels"):
        if not isinstance(c[k], int) or c[k] < (0 if k in ("iterations", "seed") else 1):
            raise ValueError(f"config {k} must be a whole number >= {0 if k in ('iterations', 'seed') else 1}")
    if not isinstance(c["lr"], (int, float)) or not 0 < c["lr"] <= 10:
        raise ValueError("config lr must be in (0, 10]")
    return c


def build_model(channels: int):
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, channels, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(channels, 2 * channels, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * channels * 16, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def load_digits_tensors(dev):
    import torch
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    xt = torch.tensor(x / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8).to(dev)
    return xt, torch.tensor(y, dtype=torch.int64).to(dev)


def evaluate(model, x, y) -> tuple[float, float]:
    """(loss, accuracy) on the whole set."""
    import torch
    from torch.nn import functional as F

    with torch.no_grad():
        z = model(x)
        return float(F.cross_entropy(z, y)), float((z.argmax(1) == y).float().mean())


def train(config: dict) -> None:
    import torch
    from torch.nn import functional as F

    c = check_config(config)
    dev = session.device()
    torch.manual_seed(c["seed"])
    net = build_model(c["channels"]).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=c["lr"], momentum=0.9)
    start = 0
    state = session.load()
    if state is not None:
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["iteration"])
    model = net
    if session.world_size() > 1:
        model = torch.nn.parallel.DistributedDataParallel(net)
    x, y = load_digits_tensors(dev)
    rank, total = session.rank(), c["iterations"]

    it, saved, loss = start, start, float("nan")
    while total == 0 or it < total:
        if session.should_stop(iteration=it, loss=loss):
            if it != saved:  # the same on every rank: they agreed on this boundary
                session.save({"iteration": it, "model": net.state_dict(), "optimizer": opt.state_dict()}, it, loss=loss)
            return
        g = torch.Generator().manual_seed(hash((c["seed"], it, rank)) & 0x7FFFFFFF)
        idx = torch.randint(0, len(y), (c["batch_size"],), generator=g).to(dev)
        opt.zero_grad()
        out = F.cross_entropy(model(x[idx]), y[idx])
        out.backward()
        opt.step()
        loss, it = out.item(), it + 1
        if c["iteration_delay_s"]:
            time.sleep(c["iteration_delay_s"])
        if it % c["checkpoint_every"] == 0 or it == total:
            full_loss, acc = evaluate(net, x, y)
            session.save(
                {"iteration": it, "model": net.state_dict(), "optimizer": opt.state_dict()},
                it,
                loss=loss,
                eval_loss=full_loss,
                accuracy=acc,
            )
            saved = it
