"""Decoding REST infer bodies without stalling the event loop.

Decoding JSON numbers is the one per-request cost that grows with the body and runs entirely in C
holding the GIL (orjson, then numpy's conversion): a 30 MiB JSON tensor of small integers takes
about 1.3 s on this machine's cores and twenty times its text in memory while it runs. On the event
loop that is 1.3 s during which no other client is answered. So bodies whose JSON part is at least
``json_offload_bytes`` are decoded in a worker process, one at a time, and handed back as numpy
arrays; the loop only pickles the body out and the arrays back in. Smaller bodies (every ordinary
request: a one-row digits request is 0.5 KiB, a 32-row heavy one 0.6 MiB) decode inline as before.
The bodies waiting for the worker stay counted against ``max_inflight_bytes``.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import resource_tracker
from typing import Any

from sloserve.gateway.backends.proctree import die_with_parent
from sloserve.gateway.errors import Unavailable
from sloserve.gateway.transports.codec import InputLimits, decode_rest
from sloserve.gateway.types import InferRequest

log = logging.getLogger("sloserve.rest")


def _decode_checked(
    body: bytes,
    header_len: int | None,
    model: str,
    version: str | None,
    headers: dict[str, str] | None,
    limits: InputLimits,
    names: tuple[str, ...] | None = None,
) -> InferRequest:
    req = decode_rest(body, header_len, model, version, headers, names, limits)
    limits.check(req)
    return req


def _ready() -> bool:
    return True


class RestDecoder:
    """Decodes a REST body to a checked :class:`InferRequest`: inline, or in the worker when large.

    ``offload_bytes`` None decodes everything inline. The worker process is started by :meth:`start`
    (spawned, so it shares nothing with Ray's threads) and replaced if it dies; a request whose
    decoding was lost with it gets 503 + Retry-After.
    """

    def __init__(self, limits: InputLimits, offload_bytes: int | None):
        self.limits = limits
        self.offload_bytes = offload_bytes
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        if self.offload_bytes is not None and self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=die_with_parent
            )
            self._pool.submit(_ready)  # start the worker now, not on the first large body

    def close(self, wait: bool = True) -> None:
        """Stop the worker (after the decoding it is doing, at most about a second); the ones queued
        behind it are cancelled."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.shutdown(wait=wait, cancel_futures=True)
            if wait:
                # multiprocessing's resource tracker (a child spawned with the pool) would otherwise
                # outlive us by a moment as an orphan; stopping it here collects it (stdlib, 3.8+).
                # A gateway worker (sloserve/gateway/workers.py) shares its supervisor's tracker: not its to stop.
                tracker: Any = resource_tracker._resource_tracker  # private: not in typeshed
                if getattr(tracker, "_pid", None) is not None:
                    tracker._stop()

    def decode_inline(
        self,
        body: bytes,
        header_len: int | None,
        model: str,
        version: str | None,
        headers: dict[str, str] | None,
        names: tuple[str, ...] | None = None,
    ) -> InferRequest | None:
        """The checked request when ``body`` is small enough to decode on the loop (every ordinary
        one); None when it goes to the worker (:meth:`decode`). ``names``: the model's inputs, checked
        with the count and declared shapes before any tensor is decoded (``codec.decode_rest``)."""
        json_len = len(body) if header_len is None else header_len
        self.limits.check_json(json_len)
        if self.offload_bytes is not None and json_len >= self.offload_bytes:
            return None
        req = decode_rest(body, header_len, model, version, headers, names, self.limits)
        self.limits.check(req)
        return req

    async def decode(
        self,
        body: bytes,
        header_len: int | None,
        model: str,
        version: str | None,
        headers: dict[str, str] | None,
        names: tuple[str, ...] | None = None,
    ) -> InferRequest:
        req = self.decode_inline(body, header_len, model, version, headers, names)
        if req is not None:
            return req
        if self._pool is None:
            self.start()
        assert self._pool is not None
        try:
            fut = self._pool.submit(_decode_checked, body, header_len, model, version, headers, self.limits, names)
            return await asyncio.wrap_future(fut)
        except BrokenProcessPool:
            log.error("the JSON decoding worker died; starting another")
            self.close(wait=False)
            self.start()
            raise Unavailable("the server lost this request's JSON decoding; retry", retry_after_s=1.0) from None
