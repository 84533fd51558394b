"""A policy-private mirror of a queue in deadline order, kept incrementally between calls.

Drivers append new requests at the tail of ``QueueView.items`` and remove the ones a decision
named. Re-sorting a 1,000-item queue on every ``plan`` would cost more than the decision itself,
so this mirror inserts only the new tail (found by walking back from the end until a known id)
and drops the ids the policy itself dispatched or shed. Anything else (a driver that removed
requests on its own, ids not appended in order) shows up as a size mismatch and triggers a full
rebuild, so the mirror is always right and usually cheap.

Order: the lowest priority level first (``QueuedItem.priority``: Triton's level, 1 the highest; 0 when
the model has no levels, so the order is by deadline alone), then earliest deadline, then earlier
arrival, then id.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from sloserve.batching.types import QueuedItem

Entry = tuple  # (priority, deadline_s, arrival_s, id, item)


def entry(item: QueuedItem) -> Entry:
    return (item.priority, item.deadline_s, item.arrival_s, item.id, item)


class DeadlineOrder:
    __slots__ = ("_gone", "big_items", "entries", "known", "max_size", "rows")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.known: dict[int, QueuedItem] = {}
        self._gone: set[int] = set()
        self.rows = 0
        self.big_items = 0  # items with size > 1 (if none, rows ahead == items ahead)
        self.max_size = 1  # largest item size ever seen (bounds the shed scan)

    def forget(self, ids: Iterable[int]) -> None:
        """The policy decided these leave the queue (dispatched or shed)."""
        self._gone.update(ids)

    def _drop_gone(self) -> None:
        gone = self._gone
        known = self.known
        hit = [known.pop(i) for i in gone if i in known]
        if hit:
            for it in hit:
                self.rows -= it.size
                self.big_items -= it.size > 1
            ents = self.entries
            n = len(hit)
            if all(e[3] in gone for e in ents[:n]):
                del ents[:n]
            elif n <= 8:
                for it in hit:
                    k = bisect.bisect_left(ents, entry(it))
                    if k < len(ents) and ents[k][3] == it.id:
                        ents.pop(k)
            else:
                self.entries = [e for e in ents if e[3] not in gone]
        gone.clear()

    def _rebuild(self, items: Sequence[QueuedItem]) -> list[QueuedItem]:
        old = self.known
        self.known = {it.id: it for it in items}
        self.entries = sorted(entry(it) for it in items)
        self.rows = sum(it.size for it in items)
        self.big_items = sum(1 for it in items if it.size > 1)
        self.max_size = max([self.max_size] + [it.size for it in items])
        return [it for it in items if it.id not in old]

    def sync(self, items: Sequence[QueuedItem]) -> list[QueuedItem]:
        """Bring the mirror in line with ``items``; returns the items new since the last call."""
        if self._gone:
            self._drop_gone()
        known = self.known
        i = len(items) - 1
        while i >= 0 and items[i].id not in known:
            i -= 1
        new = list(items[i + 1 :])
        if len(known) + len(new) != len(items) or len(new) > 64:
            return self._rebuild(items)
        ents = self.entries
        for it in new:
            known[it.id] = it
            self.rows += it.size
            self.big_items += it.size > 1
            self.max_size = max(self.max_size, it.size)
            bisect.insort(ents, entry(it))
        return new

    def rows_before(self, item: QueuedItem) -> int:
        """Queued rows ordered strictly before ``item`` (which need not be queued)."""
        k = bisect.bisect_left(self.entries, entry(item))
        if not self.big_items:
            return k
        return sum(e[4].size for e in self.entries[:k])
