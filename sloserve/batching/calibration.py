"""Online calibration: observed batches pull a latency profile towards what the replica really does.

A profile (``sloserve.batching.profile``) is a prior, not a promise: it may be stale (a new driver, a noisy
neighbour) or foreign (measured on another device type). :class:`Calibrator` keeps, per
(model, variant, device type), a window of recent observations and answers ``latency_s`` like a
:class:`~sloserve.batching.profile.ProfileTable` does, but corrected.

Design choice: **windowed ratio quantiles per batch-size bucket, on top of the profile's shape**.
Each observation is stored as ``ratio = observed latency / profile p50 at its batch size``, in a
bucket by batch size (1, 2-3, 4-7, 8-15, ... : powers of two). The calibrated curve is then::

    p50(n) = profile_p50(n) * median(ratios)         p99(n) = profile_p50(n) * q99(ratios)

using the bucket of ``n`` when it holds ``min_samples`` observations, else every observation of
the key (pooled), blended with the prior by ``w = min(1, k / prior_weight)`` for the key's ``k``
samples (the prior only bridges the first few batches).
Why not a fitted ``a*n + b``: measured curves are not linear (a GPU is flat until it saturates,
then linear; a CPU steps at cache and thread boundaries), and a line fitted to the few sizes the
live policy happens to use extrapolates badly to the sizes it is deciding whether to try. Keeping
the profile's shape and learning a ratio needs few samples, extrapolates with the profile's own
shape, and the ratio *is* the drift we export. Quantiles of a window (rather than a mean) give a
real tail, and the window (count and age, ``max_age_s``, measured on ``BatchResult.finished_s``)
lets a changed replica replace its history. Pure: no clock is read.

A (model, variant) with no profile at all gets a proportional prior ``prior_ms_per_row * n``,
which the ratios then scale.

**A regime change is followed within batches, not within a window.** A window's p99 is moved by
its top 1%: after a change (a burst that makes the replica share its core with a busy event loop,
a noisy neighbour) the next few batches all run slower than the window's p99, and the window only
learns it after ~1% of its samples are new. So the tail ratio is floored by the second largest of
the key's last ``recent`` ratios (``recent=0``: off): at a steady state that is about the window's
p80 and does not bind; after a change it binds from the second slow batch on, and one outlier (a
collection pause) moves nothing. Such an observation also sets ``urgent``, so a
:class:`~sloserve.batching.latency.LatencyModel` rebuilds its tables at once instead of after
``refresh_every`` batches.

>>> from sloserve.batching.profile import ProfileTable
>>> from sloserve.batching.types import BatchResult
>>> t = ProfileTable.from_points({("m", "v", "cpu"): ([1, 8], [1.0, 4.0], [1.5, 6.0])})
>>> c = Calibrator(t, min_samples=4, prior_weight=0.0)
>>> for i in range(8): c.observe(BatchResult("m", "v", 8, 0.008, finished_s=float(i)))
>>> round(c.drift()[("m", "v", "cpu")], 3), round(c.latency_s("m", "v", "cpu", 8, "p50"), 4)
(2.0, 0.008)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from sloserve.batching.profile import Curve, Key, ProfileTable
from sloserve.batching.types import BatchResult


def _bucket(rows: int) -> int:
    return max(rows, 1).bit_length()


def _quantile(sorted_xs: list[float], q: float) -> float:
    """Nearest-rank quantile (conservative for the tail: q99 of 50 samples is the max)."""
    n = len(sorted_xs)
    idx = min(n - 1, max(0, int(-(-q * n // 1)) - 1))
    return sorted_xs[idx]


@dataclass(slots=True)
class _Window:
    """Recent (finished_s, ratio) pairs, with their sorted ratios cached until the next change."""

    samples: deque = field(default_factory=deque)
    _sorted: list[float] | None = None

    def add(self, t: float, ratio: float, cap: int, oldest_s: float) -> None:
        self.samples.append((t, ratio))
        while len(self.samples) > cap or (self.samples and self.samples[0][0] < oldest_s):
            self.samples.popleft()
        self._sorted = None

    def stats(self, tail_q: float) -> tuple[int, float, float]:
        """(count, median ratio, tail ratio)."""
        if self._sorted is None:
            self._sorted = sorted(r for _, r in self.samples)
        xs = self._sorted
        if not xs:
            return 0, 1.0, 1.0
        return len(xs), _quantile(xs, 0.5), _quantile(xs, tail_q)


@dataclass(slots=True)
class _KeyState:
    pooled: _Window = field(default_factory=_Window)
    buckets: dict[int, _Window] = field(default_factory=dict)
    last_s: float = float("-inf")
    recent: deque = field(default_factory=deque)  # the last ``recent`` (finished_s, ratio), newest last
    floor: float = 0.0  # second largest ratio of ``recent`` (0 until it holds two)


class Calibrator:
    """A profile table corrected online by observed batches (see the module docstring).

    ``observe`` is O(window) at worst (pruning), ``latency_s`` O(log sizes) once the window's
    sorted ratios are cached; ``version`` increases with every accepted observation so callers
    can cache curves derived from it.
    """

    def __init__(
        self,
        table: ProfileTable | None = None,
        *,
        window: int = 256,
        min_samples: int = 16,
        prior_weight: float = 16.0,
        max_age_s: float = 300.0,
        tail_quantile: float = 0.99,
        prior_ms_per_row: float = 1.0,
        recent: int = 8,
    ):
        if window < 1 or min_samples < 1 or prior_weight < 0 or max_age_s <= 0 or recent < 0:
            raise ValueError("window, min_samples, max_age_s must be positive; prior_weight, recent >= 0")
        self.recent = recent
        self.urgent = 0  # counts observations above the tail last answered: rebuild tables now
        self.prior = table if table is not None else ProfileTable({})
        self.window = window
        self.min_samples = min_samples
        self.prior_weight = prior_weight
        self.max_age_s = max_age_s
        self.tail_quantile = tail_quantile
        self.prior_ms_per_row = prior_ms_per_row
        self.version = 0
        self._keys: dict[Key, _KeyState] = {}
        self._fallback = Curve((1,), (prior_ms_per_row / 1e3,), (prior_ms_per_row / 1e3,))

    # ---- learning -------------------------------------------------------------------------
    def prior_curve(self, model: str, variant: str, device_type: str) -> Curve:
        c = self.prior.curve(model, variant, device_type)
        return c if c is not None else self._fallback

    def observe(self, result: BatchResult) -> None:
        """Add one batch's latency; failed or empty batches say nothing about speed."""
        if not result.ok or result.rows < 1 or result.latency_s <= 0:
            return
        key = (result.model, result.variant, result.device_type)
        prior_s = self.prior_curve(*key).at(result.rows, "p50")
        ratio = result.latency_s / prior_s
        st = self._keys.get(key)
        if st is None:
            st = self._keys[key] = _KeyState()
        t = result.finished_s
        st.last_s = max(st.last_s, t)
        oldest = st.last_s - self.max_age_s
        st.pooled.add(t, ratio, self.window, oldest)
        b = _bucket(result.rows)
        w = st.buckets.get(b)
        if w is None:
            w = st.buckets[b] = _Window()
        w.add(t, ratio, self.window, oldest)
        if self.recent:
            rq = st.recent
            rq.append((t, ratio))
            while len(rq) > self.recent or rq[0][0] < oldest:  # as the window: by count and by age
                rq.popleft()
            top = second = 0.0  # the two largest recent ratios
            for _, x in rq:
                if x > top:
                    top, second = x, top
                elif x > second:
                    second = x
            old_floor, st.floor = st.floor, second
            if second > old_floor and second > st.pooled.stats(self.tail_quantile)[2]:
                self.urgent += 1
        self.version += 1

    # ---- answering ------------------------------------------------------------------------
    def latency_s(self, model: str, variant: str, device_type: str, rows: int, quantile: str = "p99") -> float:
        prior = self.prior_curve(model, variant, device_type)
        prior_q = prior.at(rows, quantile)
        st = self._keys.get((model, variant, device_type))
        if st is None:
            return prior_q
        kp, med, tail = st.pooled.stats(self.tail_quantile)
        if kp == 0:
            return prior_q
        pooled_tail = tail
        win = st.buckets.get(_bucket(rows))
        if win is not None:
            kb, bmed, btail = win.stats(self.tail_quantile)
            if kb >= self.min_samples:
                med, tail = bmed, btail
        if quantile == "p99" and st.floor > pooled_tail:  # a regime change (over the key's p99), not
            tail = max(tail, st.floor)  # one batch size running slower than the others
        observed = prior.at(rows, "p50") * (tail if quantile == "p99" else med)
        # Confidence comes from all of the key's samples (the ratio is what is learned, the shape is
        # the profile's), and reaches 1 at prior_weight samples: a k / (k + prior_weight) blend
        # never lets go of the prior, and with a large drift (a replica 100x slower than its
        # profile) even a full window kept ~6% of the prior, predicting every batch too fast.
        w = min(1.0, kp / self.prior_weight) if self.prior_weight > 0 else 1.0
        return w * observed + (1.0 - w) * prior_q

    def drift(self) -> dict[Key, float]:
        """Per key, median observed / profile p50 latency (1.0: the profile is right; >1: slower)."""
        return {key: st.pooled.stats(self.tail_quantile)[1] for key, st in self._keys.items() if st.pooled.samples}

    def samples(self, key: Key) -> int:
        st = self._keys.get(key)
        return len(st.pooled.samples) if st is not None else 0

    def snapshot(self, max_rows: int = 0) -> ProfileTable:
        """A frozen table of the calibrated curves (prior sizes, plus powers of two to ``max_rows``)."""
        curves = dict(self.prior.curves)
        for key in self._keys:
            prior = self.prior_curve(*key)
            sizes = set(prior.batch_sizes)
            n = 1
            while n <= max_rows:
                sizes.add(n)
                n *= 2
            xs = tuple(sorted(sizes))
            curves[key] = Curve(
                xs, tuple(self.latency_s(*key, x, "p50") for x in xs), tuple(self.latency_s(*key, x, "p99") for x in xs)
            )
        return ProfileTable(curves, self.prior.accuracy)
