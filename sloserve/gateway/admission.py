"""The data plane's door, for every transport: a request's arrival stamp, the bound on request bytes
held at once (``max_inflight_bytes``), and the refusal while the event loop lags (``loop_lag_shed_ms``,
sloserve/gateway/looplag.py), all before a request's body is decoded."""

from __future__ import annotations

import random
from collections.abc import Callable

from sloserve.batching.clock import Clock, MonotonicClock
from sloserve.gateway.config import Settings
from sloserve.gateway.errors import DeadlineUnreachable, TooManyRequests
from sloserve.gateway.looplag import LoopLag, door_ms
from sloserve.gateway.metrics import Metrics


class InflightBytes:
    """Request bytes held in the gateway at once (being decoded, queued or in a batch), over every
    model and transport, bounded by ``max_inflight_bytes``: past it a request is refused with 429 +
    Retry-After before its body is read (when it declares a Content-Length), so a flood of large
    requests cannot grow the gateway's memory without bound. One event loop: no lock.

    >>> held = InflightBytes(1024)
    >>> n = held.take(1000, "digits"); held.give(n); held.held
    0
    """

    def __init__(self, limit: int, on_refuse=None):
        self.limit = limit
        self.held = 0
        self.on_refuse = on_refuse or (lambda model: None)

    def take(self, n: int, model: str) -> int:
        if n > 0 and self.held + n > self.limit:
            self.on_refuse(model)
            raise TooManyRequests(
                f"the gateway holds {self.held} request bytes, and {n} more would pass its "
                f"max_inflight_bytes={self.limit}; retry later",
                retry_after_s=1.0,
            )
        self.held += max(n, 0)
        return max(n, 0)

    def give(self, n: int) -> None:
        self.held -= n


class Ticket:
    """One request's pass through the data plane's door, for every transport.

    Made by :meth:`Admission.admit` (the data plane's ``admit``) before the body is read: it stamps the arrival and reserves the
    body's declared bytes (429 past ``max_inflight_bytes``). :meth:`read` runs when the whole body is
    in: the event-loop door (503 while the loop lags past ``loop_lag_shed_ms``) and the bytes beyond
    the declared ones. :meth:`release` (or leaving the ``with`` block) gives the bytes back, whatever
    happened.
    """

    __slots__ = ("arrival_s", "gate", "held", "model", "open")

    def __init__(self, gate: Admission, model: str, declared_bytes: int):
        self.gate, self.model, self.held, self.open = gate, model, 0, False
        self.arrival_s = gate.arrival_now()
        self.held = gate.inflight.take(declared_bytes, model)
        self.open = True
        gate.open_requests += 1

    def grow(self, n_bytes: int) -> None:
        """``n_bytes`` of the body are in so far: a chunked body, or one longer than it declared, is
        counted as it streams (429 the moment it would pass ``max_inflight_bytes``)."""
        if n_bytes > self.held:
            self.held += self.gate.inflight.take(n_bytes - self.held, self.model)

    def read(self, n_bytes: int) -> None:
        self.gate.door(self.model)
        self.grow(n_bytes)

    def release(self) -> None:
        self.gate.inflight.give(self.held)
        self.held = 0
        if self.open:
            self.open = False
            self.gate.open_requests -= 1

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class Admission:
    """The door of one data plane: ``served`` says whether a model is served now (an unknown model
    adds no series and is refused later, with its 404)."""

    def __init__(self, settings: Settings, metrics: Metrics, clock: Clock, served: Callable[[str], bool]):
        self.metrics = metrics
        self.clock = clock
        self.served = served
        self.inflight = InflightBytes(settings.max_inflight_bytes, self._refused_bytes)
        self.open_requests = 0  # requests past the door and not yet answered (tickets not released)
        _inflight_gauge(metrics, self.inflight)
        # the event loop's lag (sloserve/gateway/looplag.py): a metric, and optionally counted against deadlines
        self.loop_lag = LoopLag() if isinstance(clock, MonotonicClock) else None
        self._lag_shed_s = door_ms(settings) / 1e3 if self.loop_lag is not None else 0.0
        self._door_rng = random.Random(0)
        if self.loop_lag is not None:
            metrics.loop_lag.set_function(lambda: self.loop_lag.estimate_s if self.loop_lag is not None else 0.0)

    def admit(self, model: str, declared_bytes: int = 0) -> Ticket:
        """A request for ``model`` is at the door (see :class:`Ticket`): raises ``TooManyRequests``
        when its declared bytes would pass ``max_inflight_bytes``."""
        return Ticket(self, model, declared_bytes)

    def arrival_now(self) -> float:
        """A request's arrival stamp (it also keeps the event-loop lag probe running)."""
        if self.loop_lag is not None:
            self.loop_lag.touch()
        return self.clock.now()

    def door(self, model: str) -> None:
        """Refuse a request before it is decoded while the event loop lags past ``loop_lag_shed_ms``
        (the probes' mean, counted while the latest probe is late too): a share ``(lag - t) / t`` of
        them between ``t`` and ``2t``, every one above. Raises :class:`DeadlineUnreachable` (reason
        ``overload``); a no-op when the setting is 0 and for a model that does not exist (its 404)."""
        t = self._lag_shed_s
        ll = self.loop_lag  # (t is 0 without it)
        if not t or ll is None or not self.served(model):  # (an unknown model adds no series)
            return
        # the loop's own lag (a core taken by another process is no reason to refuse); a stall that is
        # over lets the door go
        lag = ll.own_estimate_s if ll.own_last_s > t else 0.0
        if lag <= t or (lag < 2 * t and self._door_rng.random() >= (lag - t) / t):
            return
        self.metrics.observe_request(model, "none", "shed", 0.0, False)
        self.metrics.shed.labels(model, "overload").inc()
        raise DeadlineUnreachable(
            f"the gateway is overloaded: its event loop runs {lag * 1e3:.1f} ms behind (loop_lag_shed_ms "
            f"{t * 1e3:g}); retry after Retry-After, or spread the load over more gateway processes",
            retry_after_s=max(0.05, 4 * lag),
            reason="overload",
        )

    def _refused_bytes(self, model: str) -> None:
        self.metrics.observe_request(model if self.served(model) else "unknown", "none", "rejected", 0.0, None)


def _inflight_gauge(metrics: Metrics, inflight: InflightBytes) -> None:
    from prometheus_client import Gauge

    g = Gauge(
        "sloserve_inflight_bytes",
        "Request bytes held in the gateway (decoding, queued, in a batch).",
        registry=metrics.registry,
    )
    g.set_function(lambda: inflight.held)
