"""What a training function calls, on every Ray Train worker of its gang.

>>> # def train(config):                      # entry = "mypkg.train:train"
>>> #     model = Net().to(session.device())
>>> #     start, state = 0, session.load()       # the latest good checkpoint, or None
>>> #     if state: start = state["iteration"]; model.load_state_dict(state["model"])
>>> #     for it in range(start, config["iterations"]):
>>> #         loss = step(model)
>>> #         if session.should_stop(iteration=it + 1, loss=loss):   # preempted: save and return
>>> #             session.save({"iteration": it + 1, "model": model.state_dict()}, it + 1); return
>>> #         if (it + 1) % config["checkpoint_every"] == 0:
>>> #             session.save({"iteration": it + 1, "model": model.state_dict()}, it + 1, loss=loss)

``should_stop`` is a collective when the gang has more than one worker (every worker calls it once
per iteration, as DDP calls all-reduce): the workers agree on the same iteration boundary, so none
is left waiting in a collective for one that returned. ``save`` is collective too (Ray Train's
``report``); rank 0 writes the files. The preemption request comes from the job's driver actor
(``runtime.TrainingDriver``), read by a background thread every ``POLL_S``, so ``should_stop`` costs
a local flag read plus, in a gang, one small all-reduce.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sloserve.training.checkpoint import checkpoint_dir_name, verify, write_manifest

POLL_S = 0.05
PROGRESS_EVERY_S = 0.2
STATE_FILE = "state.pt"

_resume_from: str | None = None  # the checkpoint directory a new run starts from (chosen by the driver)
_control: Any = None  # the job's driver actor (None outside a managed run: should_stop is always False)
_stop = threading.Event()
_poller: threading.Thread | None = None
_last_progress = 0.0


def _bind(control: Any, resume_from: str | None = None) -> None:
    """Called by the runtime on each worker before the user's function."""
    global _control, _poller, _last_progress, _resume_from
    _control, _last_progress, _resume_from = control, 0.0, resume_from
    _stop.clear()
    if control is not None and _poller is None:
        _poller = threading.Thread(target=_poll, daemon=True, name="sloserve-stop-poll")
        _poller.start()


def _poll() -> None:
    import ray

    while True:
        c = _control
        if c is not None and not _stop.is_set():
            try:
                if ray.get(c.stop_requested.remote(), timeout=5):
                    _stop.set()
            except Exception:  # the driver is gone: the run is being torn down
                _stop.set()
        time.sleep(POLL_S)


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 else None


def rank() -> int:
    d = _dist()
    return d.get_rank() if d is not None else 0


def world_size() -> int:
    d = _dist()
    return d.get_world_size() if d is not None else 1


def device():
    """This worker's device: its CUDA GPU when there is one, else the CPU (emulated GPUs)."""
    import torch

    if torch.cuda.is_available():
        import ray.train.torch

        return ray.train.torch.get_device()
    return torch.device("cpu")


def should_stop(iteration: int | None = None, **metrics: float) -> bool:
    """True when the job is asked to stop (preemption, cancel): save and return. ``iteration`` and
    ``metrics`` are the job's progress, shown in its status (rank 0's, a few times a second)."""
    global _last_progress
    now = time.monotonic()
    if _control is not None and iteration is not None and rank() == 0 and now - _last_progress >= PROGRESS_EVERY_S:
        _last_progress = now
        _control.progress_update.remote(int(iteration), {k: float(v) for k, v in metrics.items()})
    flag = _stop.is_set()
    d = _dist()
    if d is None:
        return flag
    import torch

    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    d.all_reduce(t, op=d.ReduceOp.MAX)
    return bool(t.item())


PLAIN = (str, int, float, bool, type(None), bytes)


def check_plain(state: Any, where: str = "state") -> None:
    """Refuse a state that ``torch.load(weights_only=True)`` would not read back: only tensors,
    dicts (str or int keys), lists, tuples, strings, numbers, booleans and None.

    >>> check_plain({"iteration": 3, "model": {"w": [1.0, 2.0]}})
    >>> check_plain({"opt": object()})
    Traceback (most recent call last):
    ...
    TypeError: state['opt'] is a object: a checkpoint holds tensors, dicts, lists, tuples, strings, numbers, booleans and None (use state_dict())
    """
    import torch

    if isinstance(state, (*PLAIN, torch.Tensor, torch.dtype, torch.device, torch.Size)):
        return
    if isinstance(state, dict):
        for k, v in state.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"{where} has a key of type {type(k).__name__}: checkpoint keys are strings or ints")
            check_plain(v, f"{where}[{k!r}]")
        return
    if isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            check_plain(v, f"{where}[{i}]")
        return
    raise TypeError(
        f"{where} is a {type(state).__name__}: a checkpoint holds tensors, dicts, lists, tuples, strings, "
        "numbers, booleans and None (use state_dict())"
    )


def save(state: dict, iteration: int, **metrics: float) -> None:
    """Checkpoint ``state`` as of ``iteration``; every worker calls it. ``state`` holds tensors and
    plain values only (``check_plain``: what ``load`` reads back without unpickling code), e.g.
    ``{"iteration": it, "model": model.state_dict(), "optimizer": opt.state_dict()}``."""
    import ray.train
    import torch

    check_plain(state)
    m = {"iteration": int(iteration), **{k: float(v) for k, v in metrics.items()}}
    if _stop.is_set():  # saved on a stop request: once it is in storage the stopping run has lost nothing
        m["stopping"] = 1.0
    if rank() == 0:
        with tempfile.TemporaryDirectory(prefix="sloserve-ckpt-") as tmp:
            torch.save(state, Path(tmp) / STATE_FILE)
            write_manifest(tmp, iteration, m)
            ray.train.report(
                m,
                checkpoint=ray.train.Checkpoint.from_directory(tmp),
                checkpoint_dir_name=checkpoint_dir_name(iteration),
            )
        if _control is not None:
            _control.checkpoint_update.remote(int(iteration), m)
    else:
        ray.train.report(m, checkpoint=None, checkpoint_dir_name=checkpoint_dir_name(iteration))


def load() -> Any | None:
    """The state of the latest good checkpoint (what ``save`` was given), or None on a fresh start."""
    import ray.train

    ckpt = ray.train.get_checkpoint()  # this run's own latest (Ray Train restarted the gang)
    if ckpt is None and _resume_from is not None:
        ckpt = ray.train.Checkpoint(_resume_from)
    if ckpt is None:
        return None
    with ckpt.as_directory() as d:
        return read_state(d, map_location=device())


def read_state(directory: str | Path, map_location: Any = None) -> Any:
    """The state a verified checkpoint directory holds, read with ``torch.load(weights_only=True)``:
    tensors and plain values only, never an unpickled object, whoever wrote the file."""
    import torch

    verify(directory)  # the driver picked a good one; a copy torn since then fails here, loudly
    return torch.load(Path(directory) / STATE_FILE, map_location=map_location, weights_only=True)
