"""When would a newly admitted request finish? Private machinery of the ``slo`` policy's ``admit``.

The queue ahead of the request (in deadline order) is played out batch by batch: full batches of
``B`` rows go to whichever allowed replica frees first, each costing its latency plus ``gap`` (the
dispatch margin, paid by every batch in the chain), and the request rides in the batch after them
with the leftover rows (a request is never split), on the replica that frees first (for a model on
several device types, whose options differ in speed: the one that finishes it first). A fluid estimate (rows / throughput, from now)
admits up to a batch and a half too many at a small ``B`` under overload (docs/reliability.md).

>>> from sloserve.batching.latency import LatencyModel
>>> lat = LatencyModel(lambda v, n: 0.100, 4)
>>> round(predict_finish(lat, [(0.100, 0, "v")], ahead=4, size=1, B=4, gap=0.0), 3)
0.3
>>> round(predict_finish(lat, [(0.100, 0, "v")], ahead=3, size=1, B=4, gap=0.0), 3)
0.2
"""

from __future__ import annotations

import heapq

from sloserve.batching.latency import LatencyModel
from sloserve.batching.options import is_option_key


def predict_finish(
    lat: LatencyModel,
    free: list[tuple[float, int, str]],
    ahead: int,
    size: int,
    B: int,
    gap: float,
    max_steps: int = 256,
) -> float:
    """``free``: (time a replica frees, variant rank, variant) per allowed replica (consumed).
    Past ``max_steps`` batches the rest is fluid: rows / the pool's full-batch throughput."""
    heapq.heapify(free)
    steps = 0
    while ahead + size > B and steps < max_steps:
        chunk = min(B, ahead)  # a request is never split: it rides with the leftover or alone
        t, r, v = heapq.heappop(free)
        heapq.heappush(free, (t + lat.latency_s(v, chunk) + gap, r, v))
        ahead -= chunk
        steps += 1
    if ahead + size > B:  # very long queue: the remainder at the pool's full-batch throughput
        tput = sum(lat.throughput_rps(v, B) for _, _, v in free)
        t0 = min(t for t, _, _ in free)
        return t0 + ahead / tput + min(lat.latency_s(v, size) for _, _, v in free)
    rows = max(ahead, 0) + size
    if any(is_option_key(v) for _, _, v in free):  # options on device types of different speeds:
        return min(t + lat.latency_s(v, rows) for t, _, v in free) + gap  # whichever finishes it first
    t, _, v = free[0]  # the replica that frees first
    return t + lat.latency_s(v, rows) + gap
