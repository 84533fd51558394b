"""The lease book that shares replica slots among gateways (sloserve/autoscaler/leases.py): a pure policy on
an explicit clock."""

from __future__ import annotations

import itertools
import random

from sloserve.autoscaler.leases import LeaseBook

APP = "sloserve-digits-small-cpu"


def held(book: LeaseBook, gw: str) -> int:
    return sum(book.granted.get(gw, {}).get(APP, {}).values())


def per_replica_use(book: LeaseBook) -> dict[str, int]:
    """What all gateways may be using on each replica (the invariant's left side)."""
    use: dict[str, int] = {}
    for g, rep in book.reports.items():
        rs = set(book.granted.get(g, {}).get(APP, {})) | set(rep.in_force.get(APP, {})) | set(rep.busy.get(APP, {}))
        for r in rs:
            use[r] = use.get(r, 0) + max(
                book.granted.get(g, {}).get(APP, {}).get(r, 0),
                rep.in_force.get(APP, {}).get(r, 0),
                rep.busy.get(APP, {}).get(r, 0),
            )
    return use


def test_a_lone_gateway_holds_every_slot():
    book = LeaseBook(depth=2)
    got = book.renew(0.0, "a", {APP: 10.0}, {APP: ["r1", "r2"]})
    assert got.grants == {APP: {"r1": 2, "r2": 2}}
    assert got.shares == {APP: 1.0}
    assert got.gateways == 1


def test_two_gateways_split_by_demand_without_oversubscribing():
    book = LeaseBook(depth=2)
    reps = {APP: ["r1", "r2", "r3"]}
    a = book.renew(0.0, "a", {APP: 300.0}, reps)
    assert sum(a.grants[APP].values()) == 6  # alone so far
    # b arrives: nothing is free until a lets go
    b = book.renew(0.1, "b", {APP: 100.0}, reps)
    assert b.grants == {}
    a = book.renew(0.2, "a", {APP: 300.0}, reps, in_force=a.grants)  # a shrinks to its target
    assert sum(a.grants[APP].values()) == 4  # 1 each, then 4 of 4 by demand: 1 + 3 = 4 (a), 1 + 1 = 2 (b)
    b = book.renew(0.3, "b", {APP: 100.0}, reps)
    assert b.grants == {}  # a has not said it applies the smaller lease yet
    a = book.renew(0.4, "a", {APP: 300.0}, reps, in_force=a.grants)
    b = book.renew(0.5, "b", {APP: 100.0}, reps)
    assert sum(b.grants[APP].values()) == 2
    assert all(n <= 2 for n in per_replica_use(book).values())
    assert book.shares("a")[APP] == 0.75 and book.shares("b")[APP] == 0.25


def test_batches_in_flight_hold_their_slots_after_the_lease_shrinks():
    book = LeaseBook(depth=2)
    reps = {APP: ["r1"]}
    a = book.renew(0.0, "a", {APP: 1.0}, reps)
    a = book.renew(0.1, "a", {APP: 1.0}, reps, in_force=a.grants)
    book.renew(0.2, "b", {APP: 1.0}, reps)
    a = book.renew(0.3, "a", {APP: 1.0}, reps, in_force=a.grants, busy={APP: {"r1": 2}})
    assert a.grants == {APP: {"r1": 1}}
    assert book.renew(0.4, "b", {APP: 1.0}, reps).grants == {}  # a still has two batches there
    a = book.renew(0.5, "a", {APP: 1.0}, reps, in_force=a.grants, busy={APP: {"r1": 1}})
    assert book.renew(0.6, "b", {APP: 1.0}, reps).grants == {APP: {"r1": 1}}


def test_a_dead_gateways_lease_returns_after_the_ttl():
    book = LeaseBook(depth=2, ttl_s=1.5)
    reps = {APP: ["r1", "r2"]}
    for t in (0.0, 0.25, 0.5):
        a = book.renew(t, "a", {APP: 1.0}, reps, in_force=book.granted.get("a"))
        b = book.renew(t + 0.1, "b", {APP: 1.0}, reps, in_force=book.granted.get("b"))
    assert sum(a.grants[APP].values()) == 2 and sum(b.grants[APP].values()) == 2
    # b dies at 0.6; a renews every 0.25 s
    t = 0.75
    while held(book, "a") < 4:
        book.renew(t, "a", {APP: 1.0}, reps, in_force=book.granted.get("a"))
        t += 0.25
    assert t - 0.6 <= 2.0
    assert "b" not in book.reports


def test_a_restarted_book_keeps_each_gateway_on_what_it_applies_until_all_have_reported():
    book = LeaseBook(depth=2, ttl_s=1.5, warm_until=1.5)
    reps = {APP: ["r1"]}
    assert book.renew(0.0, "a", {APP: 5.0}, reps, in_force={APP: {"r1": 2}}).grants == {APP: {"r1": 2}}
    assert book.renew(0.1, "b", {APP: 5.0}, reps).grants == {}
    book.renew(1.6, "a", {APP: 5.0}, reps, in_force={APP: {"r1": 2}})
    book.renew(1.7, "b", {APP: 5.0}, reps)
    a = book.renew(1.8, "a", {APP: 5.0}, reps, in_force=book.granted["a"])
    b = book.renew(1.9, "b", {APP: 5.0}, reps)
    assert a.grants == {APP: {"r1": 1}} and b.grants == {APP: {"r1": 1}}


def test_more_gateways_than_slots_leaves_some_without():
    book = LeaseBook(depth=1)
    reps = {APP: ["r1"]}
    for _ in range(3):
        for g in "abc":
            book.renew(0.0, g, {APP: 1.0}, reps, in_force=book.granted.get(g))
    assert sorted(held(book, g) for g in "abc") == [0, 0, 1]


def test_random_renewals_never_oversubscribe_a_replica():
    """Gateways come and go, demand and connections change, batches finish at random: on no replica
    may the gateways together be using more than its depth, and the book converges to full use."""
    rng = random.Random(7)
    book = LeaseBook(depth=2, ttl_s=1.0)
    replicas = [f"r{i}" for i in range(4)]
    busy: dict[str, dict[str, int]] = {}
    in_force: dict[str, dict[str, int]] = {}
    gws = ["a", "b", "c"]
    last: dict[str, float] = {}
    t = 0.0
    for step in itertools.count():
        if step == 600:
            break
        t += 0.05
        g = rng.choice(gws)
        if step % 97 == 0 and step:
            dead = rng.choice(gws)  # stops renewing for a while: its lease expires
            in_force.pop(dead, None)
            busy.pop(dead, None)
            t += 1.2
        connected = rng.sample(replicas, rng.randint(2, 4))
        if t - last.get(g, t) > book.ttl_s:  # a gateway drops a lease it could not renew in time
            in_force.pop(g, None)
            busy.pop(g, None)
        last[g] = t
        lease = in_force.get(g, {})
        mine = {r: min(busy.get(g, {}).get(r, 0), lease.get(r, 0)) for r in lease}  # some finished
        mine = {r: n - rng.randint(0, n) if n else 0 for r, n in mine.items()}
        got = book.renew(t, g, {APP: rng.uniform(0, 100)}, {APP: connected}, {APP: lease}, {APP: mine})
        new = got.grants.get(APP, {})
        in_force[g] = new
        busy[g] = {r: max(mine.get(r, 0), rng.randint(0, new.get(r, 0))) for r in set(mine) | set(new)}
        for r, n in per_replica_use(book).items():
            assert n <= 2, (step, r, n)
