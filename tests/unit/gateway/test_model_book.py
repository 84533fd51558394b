"""The model book (sloserve/gateway/backends/ray_book.py) as a plain object on a fake clock: one operation per
model cluster-wide, a gone gateway's lock freed and its half-done operation marked, and the wait
until every live gateway has applied a version. (The live book, a Ray actor under two workers, is
tests/integration/test_workers_repository.py.)"""

from __future__ import annotations

from sloserve.gateway.backends.ray_book import LIVE_S, ModelBook


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def book() -> tuple[ModelBook, Clock]:
    clock = Clock()
    return ModelBook(clock=clock), clock


async def test_one_operation_per_model_at_a_time():
    b, _ = book()
    assert await b.acquire("cnn", "g1", 0.0)
    assert not await b.acquire("cnn", "g2", 0.0)  # g1 holds it
    assert await b.acquire("digits", "g2", 0.0)  # another model is free
    await b.release("cnn", "g2")  # (not g2's: nothing happens)
    assert not await b.acquire("cnn", "g2", 0.0)
    await b.release("cnn", "g1")
    assert await b.acquire("cnn", "g2", 0.0)


async def test_only_the_lock_holder_writes_and_each_write_is_a_new_version():
    b, _ = book()
    assert await b.acquire("cnn", "g1", 0.0)
    v1 = await b.write("cnn", "g1", "LOADING", "loading", None, None)
    v2 = await b.write("cnn", "g1", "READY", "", {"slo_ms": 40.0}, [[], "{}"])
    assert v2 == v1 + 1 == 2
    try:
        await b.write("cnn", "g2", "UNAVAILABLE", "unloaded", None, None)
        raise AssertionError("a gateway without the lock wrote")
    except RuntimeError as e:
        assert "does not hold the lock" in str(e)
    entry = b.snapshot()["entries"]["cnn"]
    assert entry["state"] == "READY" and entry["override"] == {"slo_ms": 40.0} and entry["version"] == 2


async def test_a_gone_gateways_lock_is_freed_and_its_half_done_load_marked():
    b, clock = book()
    await b.poll("g1", 0, None, 0.0)
    assert await b.acquire("cnn", "g1", 0.0)
    await b.write("cnn", "g1", "LOADING", "loading", None, None)
    clock.t += LIVE_S / 2
    assert not await b.acquire("cnn", "g2", 0.0)  # g1 still counts as live
    clock.t += LIVE_S  # g1 has not polled for longer than LIVE_S
    assert await b.acquire("cnn", "g2", 0.0)
    entry = b.snapshot()["entries"]["cnn"]
    assert entry["state"] == "UNAVAILABLE" and "interrupted" in entry["reason"], entry


async def test_wait_applied_waits_for_every_live_gateway_and_not_for_gone_ones():
    b, clock = book()
    epoch = b.snapshot()["epoch"]
    for g in ("g1", "g2", "g3"):
        await b.poll(g, 0, epoch, 0.0)
    assert await b.acquire("cnn", "g1", 0.0)
    v = await b.write("cnn", "g1", "UNLOADING", "", None, None)
    assert await b.wait_applied(v, 0.0) == ["g1", "g2", "g3"]
    snap = await b.poll("g1", v, epoch, 0.0)  # applied, and nothing newer: answers after the (zero) wait
    assert snap["version"] == v
    await b.poll("g2", v, epoch, 0.0)
    assert await b.wait_applied(v, 0.0) == ["g3"]
    clock.t += LIVE_S + 1  # g3 stopped polling: gone, not waited for; g1 and g2 poll again
    await b.poll("g1", v, epoch, 0.0)
    await b.poll("g2", v, epoch, 0.0)
    assert await b.wait_applied(v, 0.0) == []
    assert set(b.gateways()) == {"g1", "g2"}


async def test_a_poll_answers_at_once_when_behind_and_a_new_book_is_applied_from_zero():
    b, _ = book()
    assert await b.acquire("cnn", "g1", 0.0)
    await b.write("cnn", "g1", "UNAVAILABLE", "unloaded", None, None)
    snap = await b.poll("g2", 0, "an-older-book", 60.0)  # behind (another epoch): no wait at all
    assert snap["version"] == 1 and snap["entries"]["cnn"]["reason"] == "unloaded"
    assert b.applied["g2"][0] == 0  # what it applied of another book counts for nothing here


async def test_a_waiting_poll_answers_on_a_new_version_not_on_another_gateways_poll():
    """Every poll wakes the waiters (wait_applied listens for them); a gateway's own long poll must
    not answer then, or two gateways would wake each other's polls without end."""
    import asyncio

    b = ModelBook()  # the real clock: the poll's timeout is asyncio's
    epoch = b.snapshot()["epoch"]
    first = asyncio.ensure_future(b.poll("g1", 0, epoch, 30.0))
    await asyncio.sleep(0)
    for _ in range(3):
        await b.poll("g2", 0, epoch, 0.0)
        await asyncio.sleep(0)
    assert not first.done(), "woken by another gateway's poll"
    assert await b.acquire("cnn", "g2", 0.0)
    await b.write("cnn", "g2", "UNAVAILABLE", "unloaded", None, None)
    snap = await asyncio.wait_for(first, 5.0)
    assert snap["version"] == 1


class _Ref:
    def __init__(self, value=None, error: BaseException | None = None):
        self.value, self.error = value, error

    def future(self):
        import concurrent.futures

        f: concurrent.futures.Future = concurrent.futures.Future()
        f.set_exception(self.error) if self.error is not None else f.set_result(self.value)
        return f


class _Method:
    def __init__(self, ref: _Ref):
        self.ref = ref

    def remote(self, *args):
        return self.ref


async def test_a_model_book_that_cannot_be_reached_is_a_503_never_a_500():
    """Ray or the book's node lost: a load or unload answers 503 with Retry-After, whether the book
    is gone before the operation takes its lock or in the middle of it."""
    import asyncio
    from types import SimpleNamespace

    import pytest
    from ray.exceptions import GetTimeoutError

    from sloserve.gateway.errors import Unavailable
    from sloserve.gateway.modelsync import SharedModels

    locks: dict = {}
    manager = SimpleNamespace(
        dp=SimpleNamespace(settings=SimpleNamespace(model_load_timeout_s=1.0)),
        _lock=lambda name: locks.setdefault(name, asyncio.Lock()),
        _check_serving=lambda: None,
    )
    shared = SharedModels(manager, "g1")  # type: ignore[arg-type]
    shared.book = SimpleNamespace(acquire=_Method(_Ref(error=GetTimeoutError("gone"))), release=_Method(_Ref()))
    with pytest.raises(Unavailable, match="model book cannot be reached") as e:
        async with shared._locked("cnn"):
            raise AssertionError("ran without the lock")
    assert e.value.retry_after_s == 2.0
    shared.book = SimpleNamespace(acquire=_Method(_Ref(True)), release=_Method(_Ref()))
    with pytest.raises(Unavailable, match="model book cannot be reached"):
        async with shared._locked("cnn"):
            raise GetTimeoutError("lost mid-way")
    assert "cnn" not in shared.own
