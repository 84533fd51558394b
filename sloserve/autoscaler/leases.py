"""Replica slots shared among gateways: who may keep how many batches on which replica.

Several gateways (processes of one host, hosts of one cluster) send batches to the same replicas.
Each replica takes ``depth`` batches at a time (its ``max_ongoing_requests``); if every gateway counted
every slot as its own, N gateways would stack N x ``depth`` batches on a replica and their admission
and batching decisions would all be wrong. A :class:`LeaseBook` hands each gateway a lease: per
replica, how many of its slots that gateway may fill. The gateways renew their leases a few times a
second, reporting their demand (rows/s), the replicas they are connected to, the lease they are
applying, and their batches in flight per replica; a gateway that stops renewing loses its lease
after ``ttl_s``.

Invariant: on every replica, the slots that all gateways may be using add up to at most ``depth``.
A gateway may be using ``max(granted, in force, busy)`` of a replica, as of its last renewal: what
the book granted it (it may not have applied it yet), the lease it was applying when it reported,
and the batches it still had there (a lease that shrinks does not recall batches already sent).
Shrinking takes effect at once; growing only into slots no other gateway may be using. So a slot
moves from one gateway to another in two renewals: the first tells the giver, the second hears that
the giver has let go.

Targets: each application's slots are split by demand (largest remainders), at least one slot to
every live gateway while there are enough, so a gateway that is idle now can still answer at once.
Pure: a function of the reports and an explicit ``now``; the Ray actor that holds one for a cluster
is ``sloserve/gateway/backends/ray_capacity.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

Grants = dict[str, dict[str, int]]  # application -> replica id -> slots


@dataclass
class Report:
    """One gateway's last renewal."""

    at: float
    demand: dict[str, float]  # application -> rows/s arriving at this gateway
    replicas: dict[str, list[str]]  # application -> replicas this gateway is connected to
    in_force: Grants  # the lease it was applying when it reported
    busy: Grants  # its batches in flight per replica


@dataclass
class Renewal:
    """What a gateway gets back: its lease and its measured share of each application's demand."""

    grants: Grants
    shares: dict[str, float]
    gateways: int  # live gateways


@dataclass
class LeaseBook:
    depth: int
    ttl_s: float = 1.5
    # A book that lost its state (its actor restarted) grants nothing new until every live gateway
    # has reported what it holds: until ``started + ttl_s``.
    warm_until: float = 0.0
    reports: dict[str, Report] = field(default_factory=dict)
    granted: dict[str, Grants] = field(default_factory=dict)

    def renew(
        self,
        now: float,
        gateway: str,
        demand: dict[str, float],
        replicas: dict[str, list[str]],
        in_force: Grants | None = None,
        busy: Grants | None = None,
    ) -> Renewal:
        in_force = in_force or {}
        self.reports[gateway] = Report(
            now, dict(demand), {a: list(r) for a, r in replicas.items()}, in_force, busy or {}
        )
        self.expire(now)
        mine = self.granted.setdefault(gateway, {})
        if now < self.warm_until:  # collecting what the gateways hold: keep each on what it applies
            self.granted[gateway] = {a: dict(g) for a, g in in_force.items()}
            return Renewal(self.granted[gateway], self.shares(gateway), len(self.reports))
        for app in set(mine) | set(replicas):
            mine[app] = self._lease(app, gateway, self.target(app, gateway))
            if not mine[app]:
                del mine[app]
        return Renewal({a: dict(g) for a, g in mine.items()}, self.shares(gateway), len(self.reports))

    def release(self, gateway: str) -> None:
        """A gateway that stops cleanly gives its lease back at once."""
        self.reports.pop(gateway, None)
        self.granted.pop(gateway, None)

    def expire(self, now: float) -> list[str]:
        gone = [g for g, r in self.reports.items() if now - r.at > self.ttl_s]
        for g in gone:
            self.release(g)
        return gone

    # ---- targets --------------------------------------------------------------------------------
    def _live(self, app: str) -> list[str]:
        return sorted(g for g, r in self.reports.items() if r.replicas.get(app))

    def _replicas(self, app: str) -> list[str]:
        """Every replica of ``app`` some live gateway is connected to."""
        seen: set[str] = set()
        for r in self.reports.values():
            seen.update(r.replicas.get(app, ()))
        return sorted(seen)

    def target(self, app: str, gateway: str) -> int:
        """``gateway``'s fair number of ``app``'s slots: split by demand (largest remainders), with
        one slot to each live gateway first while there are enough."""
        live = self._live(app)
        if gateway not in live:
            return 0
        total = self.depth * len(self._replicas(app))
        if len(live) == 1:
            return total
        floor = 1 if total >= len(live) else 0
        share = self._demand_shares(app, live)
        spare = total - floor * len(live)
        exact = {g: share[g] * spare for g in live}
        got = {g: floor + math.floor(exact[g]) for g in live}
        left = total - sum(got.values())
        # largest remainders; ties to the gateway with more demand, then by name (deterministic)
        for g in sorted(live, key=lambda g: (-(exact[g] - math.floor(exact[g])), -share[g], g))[:left]:
            got[g] += 1
        return got[gateway]

    def _demand_shares(self, app: str, live: list[str]) -> dict[str, float]:
        d = {g: max(self.reports[g].demand.get(app, 0.0), 0.0) for g in live}
        total = sum(d.values())
        if total <= 0:
            return {g: 1.0 / len(live) for g in live}
        return {g: d[g] / total for g in live}

    def shares(self, gateway: str) -> dict[str, float]:
        """``gateway``'s measured share of each application's demand among the live gateways (1/N
        while none has demand): Swayam's partial views, measured rather than configured."""
        rep = self.reports.get(gateway)
        if rep is None:
            return {}
        out = {}
        for app in rep.replicas:
            live = self._live(app)
            out[app] = self._demand_shares(app, live).get(gateway, 0.0) if live else 1.0
        return out

    # ---- placing a target on replicas ----------------------------------------------------------
    def _used_by_others(self, app: str, gateway: str, replica: str) -> int:
        used = 0
        for g, rep in self.reports.items():
            if g == gateway:
                continue
            used += max(
                self.granted.get(g, {}).get(app, {}).get(replica, 0),
                rep.in_force.get(app, {}).get(replica, 0),
                rep.busy.get(app, {}).get(replica, 0),
            )
        return used

    def _lease(self, app: str, gateway: str, target: int) -> dict[str, int]:
        """``gateway``'s new lease on ``app``: its current one, shrunk to ``target`` (first where the
        replica is most contended) or grown toward it into free slots (first where most are free),
        only on replicas it is connected to."""
        connected = set(self.reports[gateway].replicas.get(app, ()))
        lease = {r: n for r, n in self.granted.get(gateway, {}).get(app, {}).items() if r in connected and n > 0}
        free = {r: max(self.depth - self._used_by_others(app, gateway, r), 0) for r in sorted(connected)}
        for r in list(lease):  # never more than a replica has free of the others
            lease[r] = min(lease[r], free[r])
        held = sum(lease.values())
        while held > target:
            r = min(lease, key=lambda r: (free[r] - lease[r], -lease[r], r))
            lease[r] -= 1
            held -= 1
        while held < target:
            room = [r for r in free if free[r] - lease.get(r, 0) > 0]
            if not room:
                break
            r = max(room, key=lambda r: (free[r] - lease.get(r, 0), -lease.get(r, 0), r))
            lease[r] = lease.get(r, 0) + 1
            held += 1
        return {r: n for r, n in lease.items() if n > 0}
