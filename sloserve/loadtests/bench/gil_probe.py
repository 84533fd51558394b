"""What does a busy event loop's GIL cost an in-process replica? Times ``Replica.run`` (the exact
call the in-process backend makes, ONNX Runtime with the gateway's session options) alone, then in
a thread next to a pure-Python thread that holds the GIL the way a saturated event loop does.
ONNX Runtime releases the GIL while it computes, but needs it to take the inputs and to hand back
the outputs. Each time, it waits until the other thread is made to let go, which takes up to
``sys.getswitchinterval()``.

    .venv/bin/python -m sloserve.loadtests.bench.gil_probe                          # default 5 ms interval
    .venv/bin/python -m sloserve.loadtests.bench.gil_probe --switch-interval-ms 0.5

Exploratory: it changes nothing in sloserve/gateway/. Ray replicas run in processes of their own and do not
share the gateway's GIL.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import numpy as np


def time_runs(rep, x, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        rep.run(x)
        out.append(time.perf_counter() - t)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="model_repository/heavy/large/model.onnx")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--switch-interval-ms", type=float, default=None)
    a = ap.parse_args(argv)
    if a.rows < 1 or a.runs < 1:
        ap.error("--rows and --runs must be >= 1")
    if a.switch_interval_ms is not None:
        if a.switch_interval_ms <= 0:
            ap.error("--switch-interval-ms must be > 0")
        sys.setswitchinterval(a.switch_interval_ms / 1e3)
    from sloserve.replica.runtime import Replica, RuntimeOptions, make_session

    opts = RuntimeOptions()
    sess = make_session(a.model, opts)
    rep = Replica(a.model, opts, [o.name for o in sess.get_outputs()])
    inp = sess.get_inputs()[0]
    feats = [d if isinstance(d, int) else 1 for d in inp.shape[1:]]
    x = {inp.name: np.random.default_rng(0).random((a.rows, *feats), dtype=np.float32)}
    time_runs(rep, x, 20)  # warm-up
    alone = time_runs(rep, x, a.runs)
    stop = threading.Event()

    def hog() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    h = threading.Thread(target=hog, daemon=True)
    h.start()
    res: list[float] = []
    t = threading.Thread(target=lambda: res.extend(time_runs(rep, x, a.runs)))
    t.start()
    t.join()
    stop.set()
    h.join()

    def ms(xs):
        return round(statistics.median(xs) * 1e3, 3)

    print(
        f"switch interval {sys.getswitchinterval() * 1e3:g} ms, batch of {a.rows}: "
        f"alone p50 {ms(alone)} ms, next to a GIL-holding thread p50 {ms(res)} ms ({ms(res) / ms(alone):.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
