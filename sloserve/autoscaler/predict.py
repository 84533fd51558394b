"""Rate predictors over a short history of (time_s, rate_rps) points; pure functions.

Each takes ``history`` (oldest first) and ``horizon_s`` (how far past the last point to
predict) and returns a rate. Four are offered:

* ``last``   -- the latest measured rate: no lag, but no look-ahead and noisy;
* ``ewma``   -- exponentially weighted mean: smooth, lags every ramp;
* ``holt``   -- double exponential smoothing (level + trend): follows ramps, overshoots spikes;
* ``linreg`` -- least-squares line over the window, extrapolated to the horizon, never below
  the latest rate: what ``swayam`` keeps, because on the Azure traces it under-predicts least
  for the same over-provisioning, and a window (not a decay) bounds how long a spike counts;
* ``linreg-shift`` -- ``linreg`` over the points since the last level shift, so a step is not
  extrapolated as a trend (tried with swayam: cheaper, but it loses the
  SLA on on/off load; docs/simulator.md).

>>> round(predict_linreg(((0, 10.0), (10, 20.0), (20, 30.0)), horizon_s=10), 6)
40.0
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

History = Sequence[tuple[float, float]]


def predict_last(history: History, horizon_s: float) -> float:
    return history[-1][1] if history else 0.0


def predict_ewma(history: History, horizon_s: float, alpha: float = 0.3) -> float:
    level = None
    for _, r in history:
        level = r if level is None else alpha * r + (1 - alpha) * level
    return level or 0.0


def predict_holt(history: History, horizon_s: float, alpha: float = 0.5, beta: float = 0.3) -> float:
    if not history:
        return 0.0
    if len(history) == 1:
        return history[0][1]
    level, trend = history[0][1], 0.0
    dt = max((history[-1][0] - history[0][0]) / (len(history) - 1), 1e-9)
    for _, r in history[1:]:
        prev = level
        level = alpha * r + (1 - alpha) * (level + trend)
        trend = beta * (level - prev) + (1 - beta) * trend
    return max(level + trend * horizon_s / dt, 0.0)


def predict_linreg(history: History, horizon_s: float) -> float:
    n = len(history)
    if n == 0:
        return 0.0
    last_t, last_r = history[-1]
    if n < 3:
        return last_r
    st = sr = stt = str_ = 0.0
    for t, r in history:
        t -= last_t
        st += t
        sr += r
        stt += t * t
        str_ += t * r
    den = n * stt - st * st
    if den <= 0:
        return last_r
    slope = (n * str_ - st * sr) / den
    intercept = (sr - slope * st) / n
    return max(intercept + slope * horizon_s, last_r, 0.0)


def since_last_shift(history: History, jump: float = 0.1, z: float = 4.0) -> History:
    """The points after the latest level shift: a change between two consecutive points larger than
    ``jump`` of the level and ``z`` Poisson standard errors (each point a rate over the spacing of the
    points). A step is not a trend: a line fitted across one extrapolates it past the new level."""
    n = len(history)
    for i in range(n - 1, 0, -1):
        (t0, r0), (t1, r1) = history[i - 1], history[i]
        dt = max(t1 - t0, 1e-9)
        if abs(r1 - r0) > max(jump * max(r0, r1), z * math.sqrt((r0 + r1) / dt)):
            return history[i:]
    return history


def predict_linreg_shift(history: History, horizon_s: float) -> float:
    """``linreg`` over the points since the latest level shift (:func:`since_last_shift`)."""
    return predict_linreg(since_last_shift(history), horizon_s)


PREDICTORS: dict[str, Callable[[History, float], float]] = {
    "last": predict_last,
    "ewma": predict_ewma,
    "holt": predict_holt,
    "linreg": predict_linreg,
    "linreg-shift": predict_linreg_shift,
}
