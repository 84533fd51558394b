"""``swayam``: predictive, queueing-model sizing from the gateways' partial views (ours).

Per call, for one model:

1. **Aggregate** the gateways' reports: each gateway sees only its share of the traffic, so the
   total rate is ``sum(rate_g) / sum(share_g)`` over the gateways that reported (Swayam's
   frontends scale their local rate by their share; a missing report is extrapolated from the
   shares that did report; unknown shares count as ``1 / gateways seen``).
2. **Predict** the rate over the replica start-up horizon (``startup_s + interval_s``) with a
   windowed estimator with trend (``sloserve.autoscaler.predict``; ``linreg`` by default), raised by a
   **seasonal bump** when a rise at this phase recurred in each of the last ``season_cycles``
   periods of one of ``season_periods_s`` (timer-triggered load: :func:`seasonal_changes`): the
   smallest of those rises, or the largest when every one was a clear spike (more than
   ``season_spike_frac`` of its base level), whose height varies from cycle to cycle.
3. **Size**: plan for ``base * (1 + margin) + noise_z * sqrt(base / window) + burst_z * sqrt(k * base)``
   (one device type of a variant on several: its part of that, ``sloserve.autoscaler.typesplit``)
   and take the fewest replicas whose tail latency meets the SLO percentile
   (``sloserve.autoscaler.queueing.replicas_needed``). ``margin`` is ``margin_frac``; ``k = (I - 1) / bin_s``
   is how clumped the arrivals are (``sloserve.autoscaler.burst``: ``I`` the index of dispersion of the
   gateways' per-second counts, its mean over the rounds of the last ``burst_window_s``), so the
   last term is ``burst_z`` standard deviations of the per-second rate beyond Poisson's: the
   queueing model sizes for Poisson arrivals, the term for the clumps.
4. **Scale in** only after a keep-alive, and not below a high quantile of recent needs: the target
   is the largest need of the last ``keep_alive_s``, and at least the ``hold_quantile`` of the needs
   of the last ``hold_window_s`` (seasonal bumps left out), so a level the load keeps returning to
   stays warm while a lone burst is released. When the rate fell at this phase in every recent
   cycle, the keep-alive is cut short (``season_scale_in``).

>>> from sloserve.batching.profile import Curve
>>> from sloserve.autoscaler.types import ServiceModel, ScalingSnapshot, RateWindow
>>> svc = ServiceModel(Curve((1, 32), (0.01, 0.05), (0.01, 0.05)), slo_s=0.2, max_batch_size=32)
>>> snap = ScalingSnapshot("m", 1, 1, svc, windows=(RateWindow("g0", 0, 10, 500, 0.5),))
>>> d, s = decide(snap, SwayamConfig(), SwayamState(), now=10.0)
>>> d.target_replicas >= 1 and s.history[-1][1] == 100.0
True
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace

from pydantic import BaseModel, ConfigDict, Field

from sloserve.autoscaler.burst import unthinned
from sloserve.autoscaler.predict import PREDICTORS
from sloserve.autoscaler.queueing import capacity_of, replicas_needed
from sloserve.autoscaler.types import RateWindow, ScaleDecision, ScalingSnapshot, clamp


class SwayamConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    predictor: str = Field(default="linreg", description="Rate predictor: last | ewma | holt | linreg | linreg-shift.")
    window_s: float = Field(default=60.0, gt=0, description="History the predictor sees, seconds.")
    startup_s: float = Field(default=10.0, ge=0, description="Replica start-up (model load) time, seconds.")
    interval_s: float = Field(default=10.0, gt=0, description="Seconds between two decisions.")
    margin_frac: float = Field(default=0.0, ge=0, description="Relative head-room over the predicted rate.")
    noise_z: float = Field(default=1.0, ge=0, description="Poisson standard errors of head-room on the rate.")
    keep_alive_s: float = Field(default=60.0, ge=0, description="Idle time before a replica is scaled in.")
    # scale in to a high quantile of the recent needs, not below
    hold_quantile: float = Field(
        default=0.9,
        ge=0,
        le=1,
        description="Hold at least this quantile of the "
        "needs of the last hold_window_s (0: off; the keep-alive alone).",
    )
    hold_window_s: float = Field(default=600.0, gt=0, description="Needs the hold quantile is taken over.")
    # seasonal bumps: a rise that recurred at the same lag in each of the last season_cycles periods
    season_periods_s: tuple[float, ...] = Field(
        default=(300.0, 900.0, 3600.0), description="Candidate periods, seconds (empty: no seasonal term)."
    )
    season_cycles: int = Field(default=2, ge=1, description="A bump must have recurred in this many periods.")
    season_spike_frac: float | None = Field(
        default=0.15,
        ge=0,
        description="A rise that recurred in every cycle "
        "by more than this share of its base level is planned at its largest "
        "cycle, a smaller one at its smallest (None: always the smallest).",
    )
    season_base_s: float = Field(default=30.0, gt=0, description="Level before a bump, seconds.")
    season_scale_in: bool = Field(
        default=True,
        description="Scale in before the keep-alive ends when the rate fell at this phase in every recent cycle.",
    )
    season_bucket_s: float = Field(
        default=10.0,
        gt=0,
        description="One seasonal sample per this many seconds (bounds the history whatever the call rate).",
    )
    burst_z: float = Field(
        default=2.75,
        ge=0,
        description="Standard deviations of the per-second rate's excess over Poisson to plan for "
        "(clumped arrivals: the gateways' index of dispersion; 0: off).",
    )
    burst_window_s: float = Field(default=300.0, gt=0, description="Clumpiness measured over this many seconds.")
    fallback_buffer: bool = Field(
        default=True,
        description="When the model has a cheaper fallback variant, size "
        "the warm buffer (keep-alive and hold) with its throughput: a step the "
        "predictor did not see is served by the fallback until new replicas are up.",
    )

    def model_post_init(self, _ctx) -> None:
        if self.predictor not in PREDICTORS:
            raise ValueError(f"unknown predictor {self.predictor!r}; known: {sorted(PREDICTORS)}")


class SeasonLog:
    """The seasonal samples, ``(time_s, rate)`` oldest first, as a read-only sequence of pairs.

    The samples live in two append-only lists (times, rates) that successive states share; a log is
    the slice ``[lo, hi)`` of them. :meth:`add` appends in place only when this log ends where the
    lists end (the usual chain of states, one decision after the other). A log that is no longer the
    newest (an older state decided again), a replaced sample (two calls in one bucket), a trim of
    ``_COMPACT`` samples or times out of order copy instead. So a log never changes once made, and
    ``decide`` stays a pure function of its arguments, at O(1) per decision where a tuple of pairs
    cost O(samples) (a ``+`` copy and a slice per decision).

    Not meant to be appended to from two threads at once (nothing here is; the live adapter
    rebuilds the state from JSON each call).
    """

    __slots__ = ("_hi", "_lo", "_r", "_sorted", "_t")

    def __init__(self, pairs=()):
        self._t = [t for t, _ in pairs]
        self._r = [r for _, r in pairs]
        self._lo, self._hi = 0, len(self._t)
        self._sorted = all(a <= b for a, b in zip(self._t, self._t[1:], strict=False))  # (False with a NaN time)

    @classmethod
    def of(cls, season) -> SeasonLog:
        """``season`` as a log (a tuple of pairs, e.g. from ``ray_policy.state_from_json``, is copied once)."""
        return season if type(season) is SeasonLog else cls(season)

    @staticmethod
    def _view(t: list, r: list, lo: int, hi: int, sorted_: bool) -> SeasonLog:
        log = object.__new__(SeasonLog)
        log._t, log._r, log._lo, log._hi, log._sorted = t, r, lo, hi, sorted_
        return log

    def add(self, now: float, rate: float, span_s: float, bucket_s: float) -> SeasonLog:
        """Drop the samples at or before ``now - span_s``, then record ``(now, rate)``: a new sample, or
        in place of the latest one when that is less than ``bucket_s`` old."""
        t, r, hi = self._t, self._r, self._hi
        if self._sorted:  # step past the dropped samples (one or two): where bisection would land
            lo, old = self._lo, now - span_s
            while lo < hi and t[lo] <= old:
                lo += 1
        else:
            lo = bisect.bisect_right(t, now - span_s, self._lo, hi)
        keep = hi - 1 if lo < hi and now - t[hi - 1] < bucket_s - 1e-9 else hi  # same bucket: replace the latest
        sorted_ = self._sorted and (now >= t[keep - 1] if keep > lo else not math.isnan(now))
        if keep == hi and hi == len(t) and sorted_ and lo < _COMPACT:  # the usual case: append in place
            t.append(now)
            r.append(rate)
            return SeasonLog._view(t, r, lo, hi + 1, True)
        return SeasonLog._view(t[lo:keep] + [now], r[lo:keep] + [rate], 0, keep - lo + 1, sorted_)

    def _level(self, after: float) -> float:
        """The mean rate of the samples later than ``after`` (0 when none)."""
        t, lo, hi = self._t, self._lo, self._hi
        if self._sorted:  # step back from the end (a few samples)
            i = hi
            while i > lo and t[i - 1] > after:
                i -= 1
        else:
            i = bisect.bisect_right(t, after, lo, hi)
        return sum(self._r[i:hi]) / max(hi - i, 1)

    def __len__(self) -> int:
        return self._hi - self._lo

    def __iter__(self):
        return zip(self._t[self._lo : self._hi], self._r[self._lo : self._hi], strict=True)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return tuple(self)[k]
        n = self._hi - self._lo
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError("season index out of range")
        return self._t[self._lo + k], self._r[self._lo + k]

    def __eq__(self, other) -> bool:
        if isinstance(other, (SeasonLog, tuple, list)):
            return len(self) == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"SeasonLog({tuple(self)!r})"


_COMPACT = 32  # copy the kept samples to fresh lists once this many were dropped (bounds the lists)


@dataclass(frozen=True, slots=True)
class SwayamState:
    history: tuple[tuple[float, float], ...] = ()  # (time_s, aggregate rate rps), oldest first
    needs: tuple[tuple[float, int], ...] = ()  # (time_s, need): decreasing needs of the last keep_alive_s
    gateways_seen: int = 1
    season: SeasonLog | tuple[tuple[float, float], ...] = ()  # (time_s, rate), one per season bucket
    recent: tuple[tuple[float, int], ...] = ()  # (time_s, need), one per interval_s, of the last hold_window_s
    bursts: tuple[tuple[float, float], ...] = ()  # (time_s, (I - 1) / bin_s), one per round, of the last burst_window_s


def aggregate_rate(windows: tuple[RateWindow, ...], gateways_seen: int) -> float | None:
    """The model's total arrival rate estimated from partial views (None: no report).

    A gateway's reports are pooled (arrivals over time); each reporting gateway's share counts
    once, so a gateway that missed this round is extrapolated from the others' shares.
    """
    if not windows:
        return None
    default_share = 1.0 / max(gateways_seen, 1)
    n = len(windows)
    if n == 1 or (n == 2 and windows[0].gateway != windows[1].gateway) or len({w.gateway for w in windows}) == n:
        rate = share = 0.0  # the usual case: one report per gateway
        for w in windows:
            rate += w.arrivals / w.duration_s
            share += w.share if w.share > 0 else default_share
        return rate / max(share, 1e-9)
    per_gw: dict[str, list[float]] = {}
    for w in windows:
        acc = per_gw.setdefault(w.gateway, [0.0, 0.0, w.share])
        acc[0] += w.arrivals
        acc[1] += w.duration_s
    rate = share = 0.0
    for arrivals, duration, sh in per_gw.values():
        rate += arrivals / duration
        share += sh if sh > 0 else default_share
    return rate / max(share, 1e-9)


def aggregate_clumping(windows: tuple[RateWindow, ...], gateways_seen: int) -> float | None:
    """The whole stream's excess per-bin variance per unit rate, ``(I - 1) / bin_s``, from the
    gateways' dispersions (each un-thinned by its share), weighted by their arrivals (None: none)."""
    default_share = 1.0 / max(gateways_seen, 1)
    num = den = 0.0
    for w in windows:
        if w.arrivals <= 0:
            continue
        i = unthinned(w.dispersion, w.share if w.share > 0 else default_share)
        num += w.arrivals * (i - 1.0) / w.bin_s  # (below 0 too: clipping each noisy round would bias the mean up)
        den += w.arrivals
    return num / den if den > 0 else None


def _drop_before(points: tuple, t0: float) -> tuple:
    """The points with time > t0."""
    return points[_first_after(points, t0) :]


def _push_max(points: tuple, now: float, value, keep_s: float) -> tuple:
    """``(time, value)`` pairs of the last ``keep_s`` as a monotonic queue: drop the old ones and those
    not above ``value``, then append ``(now, value)``; ``points[0][1]`` is the largest of the window.

    >>> _push_max(((0.0, 5), (4.0, 3), (6.0, 2)), 8.0, 3, 5.0)
    ((8.0, 3),)
    >>> _push_max(((4.0, 5), (6.0, 2)), 8.0, 3, 5.0)
    ((4.0, 5), (8.0, 3))
    """
    points = _drop_before(points, now - keep_s)
    while points and points[-1][1] <= value:
        points = points[:-1]
    return points + ((now, value),)


def _first_after(points: tuple, t0: float, lo: int = 0) -> int:
    """Index of the first point with time > t0 (points sorted by time). Bisects on the (time, rate)
    tuples themselves against ``(t0, inf)``, in C: a ``key=`` function cost ~70% of a simulated
    day at 300 models."""
    return bisect.bisect_right(points, (t0, math.inf), lo)


def seasonal_changes(
    season,
    now: float,
    horizon_s: float,
    periods_s: tuple[float, ...],
    cycles: int,
    base_s: float,
    spike_frac: float | None = None,
) -> tuple[float, float] | None:
    """How the rate moved over the coming ``horizon_s`` one, two, ... ``cycles`` periods ago.

    For each period ``P`` and cycle ``k`` the change ``d`` is the largest rate in ``(now - kP, now - kP +
    horizon_s]`` minus the mean rate in the ``base_s`` before it. Returns ``(rise, high)``: ``rise`` is
    the largest over the periods of the smallest change over the cycles (a rise that recurred every
    time; negative when none did) and ``high`` the largest change of all (below zero only when the rate
    fell at this phase in every cycle of every period). With ``spike_frac``, a period whose change
    exceeded ``spike_frac`` of its base level in every cycle (a clear spike, e.g. timer-triggered load
    whose height varies from cycle to cycle) counts with its largest change instead of its smallest.
    A period counts once the history holds
    ``cycles`` of it; None before any does, or across a gap in the history. ``season`` is a
    :class:`SeasonLog` or a tuple of ``(time_s, rate)`` pairs, oldest first.

    Cost: three bisections of a list of floats (in C) and two short slices per period and cycle;
    ``tests/unit/autoscaler/test_season.py`` checks it against the plain tuple version.

    >>> s = tuple((float(t), 100.0 + (50.0 if t % 300 in (10, 20) else 0.0)) for t in range(0, 1201, 10))
    >>> [tuple(round(x, 1) for x in seasonal_changes(s, t, 20.0, (300.0,), 3, 30.0)) for t in (1190.0, 1170.0, 1220.0)]
    [(50.0, 50.0), (0.0, 0.0), (-33.3, -33.3)]
    >>> v = tuple((float(t), 100.0 + (25.0 * (1 + t // 300) if t % 300 in (10, 20) else 0.0))
    ...           for t in range(0, 1201, 10))
    >>> [round(seasonal_changes(v, 1190.0, 20.0, (300.0,), 3, 30.0, f)[0], 1) for f in (None, 0.1, 0.8)]
    [50.0, 100.0, 50.0]
    """
    return _changes(SeasonLog.of(season), now, horizon_s, periods_s, cycles, base_s, spike_frac)


def _changes(
    log: SeasonLog,
    now: float,
    horizon_s: float,
    periods_s: tuple[float, ...],
    cycles: int,
    base_s: float,
    spike_frac: float | None = None,
) -> tuple[float, float] | None:
    times, rates, lo, hi = log._t, log._r, log._lo, log._hi
    if lo == hi:
        return None
    first = times[lo] - 1e-9
    last = times[hi - 1]
    sorted_ = log._sorted
    # sorted times: a window's first base sample is guessed from the mean spacing (exact on an even
    # grid, as the simulator's rounds are) and checked; any other case bisects
    spacing = (last - times[lo]) / (hi - 1 - lo) if sorted_ and hi - lo > 1 else 0.0
    guess = sorted_ and spacing > 0
    rise = high = _NINF
    ks = range(1, cycles + 1)
    for period in periods_s:
        if now - cycles * period - base_s < first:  # not yet `cycles` periods of history
            continue
        low = top = _INF
        clear = spike_frac is not None  # a clear spike so far: every cycle rose by more than spike_frac
        if clear:
            top = _NINF
        for k in ks:
            t0 = now - k * period
            # the base samples [b, i) are in (t0 - base_s, t0], the peak samples [i, j) in (t0, t0 + horizon_s]
            x = t0 - base_s
            b = -1
            if guess:
                back = (last - x) / spacing
                if 1.0 <= back < hi - lo:
                    b = hi - int(back)  # lo < b < hi
                    if not times[b - 1] <= x < times[b]:
                        b = -1
            if b < 0:
                b = bisect.bisect_right(times, x, lo, hi)
            end = t0 + horizon_s
            if sorted_:  # a few samples on: step there (where bisection lands in sorted times)
                i = b
                while i < hi and times[i] <= t0:
                    i += 1
                j = i
                while j < hi and times[j] <= end:
                    j += 1
            else:
                i = bisect.bisect_right(times, t0, b, hi)
                j = bisect.bisect_right(times, end, i, hi)
            if i <= b or j <= i:  # a gap in the history: no evidence either way
                return None
            # the same sums as over (time, rate) pairs: sum() adds left to right from 0, max() keeps the first
            base = (0.0 + rates[b]) if i == b + 1 else sum(rates[b:i]) / (i - b)
            d = (rates[i] if j == i + 1 else max(rates[i:j])) - base
            # low = min(low, d) and high = max(high, d), as the plain loop had them (ifs are faster)
            if d < low:
                low = d
            if d > high:
                high = d
            if clear:
                if d > top:
                    top = d
                if d <= spike_frac * base:
                    clear = False
        if clear:  # a clear spike recurred every cycle: plan for its largest height, not its smallest
            low = top
        if low > rise:
            rise = low
    if rise == _NINF:
        return None
    return rise, high


_INF, _NINF = math.inf, -math.inf


def _quantile(values, q: float) -> float:
    xs = sorted(values)  # (a list sorts faster than a generator: callers pass one)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def decide(
    snap: ScalingSnapshot, config: SwayamConfig, state: SwayamState, now: float
) -> tuple[ScaleDecision, SwayamState]:
    seen = state.gateways_seen
    if len(snap.windows) > seen:
        seen = max(seen, len({w.gateway for w in snap.windows}))
    rate = aggregate_rate(snap.windows, seen)
    history = state.history
    season = state.season
    horizon_s = config.startup_s + config.interval_s
    if rate is not None:
        # one point per interval_s, the latest rate in it, whatever the call rate (as the bursts):
        # Ray calls a policy several times a second, and points a tenth of a second apart would turn
        # a step into a steep trend
        history = _drop_before(history, now - config.window_s)
        if history and now - history[-1][0] < config.interval_s - 1e-6:
            history = history[:-1] + ((history[-1][0], rate),)
        else:
            history = history + ((now, rate),)
        if config.season_periods_s:
            bucket = config.season_bucket_s
            span = max(config.season_periods_s) * config.season_cycles + config.season_base_s + bucket
            season = SeasonLog.of(season).add(now, rate, span, bucket)
    if not history:  # nothing measured yet: keep what runs
        return ScaleDecision(snap.target_replicas, "no-data"), replace(state, gateways_seen=seen)
    predicted = PREDICTORS[config.predictor](history, horizon_s)
    base = predicted
    fall_to = None  # a rate the seasonal history says the coming horizon stays under
    log = SeasonLog.of(season) if config.season_periods_s and season else None
    if log is not None:
        ch = _changes(
            log,
            now,
            horizon_s,
            config.season_periods_s,
            config.season_cycles,
            config.season_base_s,
            config.season_spike_frac,
        )
        if ch is not None:
            level = log._level(now - config.season_base_s)
            if ch[0] > 0:
                base = max(base, level + ch[0])
            if config.season_scale_in and ch[1] < -max(0.1 * level, 3 * math.sqrt(level / config.interval_s)):
                fall_to = level + ch[1]
    margin = config.margin_frac
    span = config.window_s if len(history) > 1 else config.interval_s
    bursts = state.bursts
    clump = 0.0
    if config.burst_z > 0:
        k = aggregate_clumping(snap.windows, seen) if rate is not None else None
        bursts = _drop_before(bursts, now - config.burst_window_s)
        if k is not None:  # one value per interval_s (the latest), whatever the call rate
            if bursts and now - bursts[-1][0] < config.interval_s - 1e-6:
                bursts = bursts[:-1] + ((bursts[-1][0], k),)
            else:
                bursts = bursts + ((now, k),)
        if bursts:
            mean = sum(v for _, v in bursts) / len(bursts)  # (a quantile of noisy rounds would see clumps in Poisson)
            clump = config.burst_z * math.sqrt(max(mean, 0.0))

    def plan_rate(r: float) -> float:
        """Rate ``r`` plus the margin, the noise term and the clumps' term: what replicas are sized for."""
        return r * (1 + margin) + config.noise_z * math.sqrt(r / span) + clump * math.sqrt(r)

    split = snap.split

    def size(r: float) -> int:
        if r <= 0:
            return 0
        p = plan_rate(r) if split is None else split.part(plan_rate(r))  # one type: its part of the plan
        return replicas_needed(snap.service, p, snap.max_replicas) if p > 0 else 0

    planned = plan_rate(base) if split is None else split.part(plan_rate(base))
    need = size(base)
    needs = _push_max(state.needs, now, need, config.keep_alive_s)  # needs[0]: the largest of the keep-alive
    held = needs[0][1]
    recent = state.recent
    if config.hold_quantile > 0:
        usual = need  # the need without a recurring (seasonal) bump: the level worth holding
        if log is not None:
            ch = _changes(
                log,
                now - config.interval_s,
                config.interval_s,
                config.season_periods_s,
                config.season_cycles,
                config.season_base_s,
                config.season_spike_frac,
            )
            if ch is not None and ch[0] > 0:
                usual = size(max(predicted - ch[0], 0.0))
        recent = _drop_before(recent, now - config.hold_window_s)
        if recent and now - recent[-1][0] < config.interval_s - 1e-6:
            recent = recent[:-1] + ((recent[-1][0], max(recent[-1][1], usual)),)
        else:
            recent = recent + ((now, usual),)
        held = max(held, _quantile([n for _, n in recent], config.hold_quantile))
    if fall_to is not None and held > need:  # a recurring fall: scale in before the keep-alive ends
        held = max(need, min(held, size(max(fall_to, 0.0))))
        needs = ((now, held),)  # the keep-alive restarts from the lowered target
    fb = snap.service.fallback
    cut = False
    if fb is not None and config.fallback_buffer and held > need:
        buffered = held
        held = max(need, replicas_needed(fb, capacity_of(snap.service, held), snap.max_replicas))
        cut = held < buffered
    target = clamp(held, snap)
    if target > snap.target_replicas:
        reason = "scale-up"
    elif target < snap.target_replicas:
        reason = "scale-in-to-fallback-buffer" if cut else "scale-in-after-keep-alive"
    else:
        reason = "hold" if need < target else "steady"
    return ScaleDecision(target, reason, planned), SwayamState(history, needs, seen, season, recent, bursts)
