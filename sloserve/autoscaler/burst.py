"""How clumped arrivals are: the index of dispersion of per-bin arrival counts.

For arrivals counted in bins of ``bin_s`` seconds, the index of dispersion is ``var(n) / mean(n)``:
1 for a Poisson process, above 1 when arrivals come in clumps (a conversation's requests at once, a
client that fans out, a timer). The gateways report it with their rates (one-second bins, as
``sloserve.gateway.rates.RateMeter`` counts them), the simulators compute the same from the trace they
replay, and ``swayam`` sizes for the clumps with it (docs/simulator.md, "Bursts"): the excess of
the per-bin rate's variance over Poisson's is ``(I - 1) * rate / bin_s``.

>>> round(index_of_dispersion([5, 5, 5, 5]), 3), round(index_of_dispersion([0, 20, 0, 0]), 3)
(0.0, 15.0)
>>> c = BinCounts()
>>> for t in (0.1, 0.2, 0.3, 2.5):
...     c.add(t)
>>> c.dispersion(4.0)  # bins of 3, 0, 1, 0 arrivals
1.5
"""

from __future__ import annotations

import math
from collections.abc import Iterable

BIN_S = 1.0  # the bin the live gateways count arrivals in


def index_of_dispersion(counts: Iterable[float]) -> float:
    """``var / mean`` of the counts (1.0, Poisson's, when fewer than two bins or no arrivals)."""
    n = s = sq = 0.0
    for c in counts:
        n += 1
        s += c
        sq += c * c
    return _ratio(n, s, sq)


def _ratio(bins: float, s: float, sq: float) -> float:
    if bins < 2 or s <= 0:
        return 1.0
    mean = s / bins
    return max(sq / bins - mean * mean, 0.0) / mean


def thinned(dispersion: float, share: float) -> float:
    """The dispersion one gateway sees of a stream it gets ``share`` of (random split): ``1 + s (I - 1)``."""
    return 1.0 + share * (dispersion - 1.0)


def unthinned(dispersion: float, share: float) -> float:
    """The whole stream's dispersion from one gateway's, its inverse: ``1 + (I_g - 1) / s``."""
    return 1.0 + (dispersion - 1.0) / max(share, 1e-9)


def excess_rate_sd(dispersion: float, rate: float, bin_s: float = BIN_S) -> float:
    """Standard deviation of the per-bin rate beyond a Poisson process's at ``rate``."""
    return math.sqrt(max(dispersion - 1.0, 0.0) * max(rate, 0.0) / bin_s)


class BinCounts:
    """Arrivals counted in ``bin_s`` bins from ``start_s`` on, for a simulator's gateway: call
    :meth:`add` at each arrival (times not decreasing), :meth:`dispersion` at a round (complete
    bins up to ``now``, empty ones included), :meth:`reset` to start the next window."""

    __slots__ = ("bin_s", "bins", "cur", "n", "s", "sq")

    def __init__(self, start_s: float = 0.0, bin_s: float = BIN_S):
        self.bin_s = bin_s
        self.reset(start_s)

    def reset(self, now: float) -> None:
        self.cur = math.floor(now / self.bin_s)  # the open bin
        self.n = 0.0
        self.bins = self.s = self.sq = 0.0

    def _close_to(self, b: int) -> None:
        if b > self.cur:
            self.s += self.n
            self.sq += self.n * self.n
            self.bins += b - self.cur  # the open bin and the empty ones after it
            self.n = 0.0
            self.cur = b

    def add(self, t: float, k: float = 1.0) -> None:
        self._close_to(math.floor(t / self.bin_s))
        self.n += k

    def dispersion(self, now: float) -> float:
        self._close_to(math.floor(now / self.bin_s))
        return _ratio(self.bins, self.s, self.sq)
