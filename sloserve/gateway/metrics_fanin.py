"""One ``/metrics`` for N gateway processes behind one port.

With ``workers`` > 1 a scrape of the shared HTTP port reaches whichever worker the kernel picks. That
worker answers for all of them: its own samples and its siblings' (each worker also answers on a
Unix socket of its own in the service's run directory), every sample labelled ``worker="<index>"``.
Sums over the label are the service's totals (the dashboards and rules sum by model); a restarted
worker's counters start again at zero, which Prometheus' ``rate`` reads as a counter reset. A
sibling that does not answer within ``SIBLING_TIMEOUT_S`` is left out of that scrape, and
``sloserve_metrics_workers_missing`` says how many were.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from sloserve.gateway.config import WorkerRole

log = logging.getLogger("sloserve")
SIBLING_TIMEOUT_S = 1.0


def merge(expositions: dict[int, str], missing: int = 0, openmetrics: bool = False) -> bytes:
    """The text expositions of several workers as one, each sample labelled with its worker.
    ``openmetrics``: the expositions and the answer are OpenMetrics (exemplars kept)."""
    families: dict[str, Metric] = {}
    parse = openmetrics_parser.text_string_to_metric_families if openmetrics else text_string_to_metric_families
    for index, text in sorted(expositions.items()):
        for fam in parse(text):
            into = families.get(fam.name)
            if into is None:
                into = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            worker = str(index)
            into.samples.extend(s._replace(labels={**s.labels, "worker": worker}) for s in fam.samples)
    gauge = Metric("sloserve_metrics_workers_missing", "Gateway workers that did not answer this scrape.", "gauge")
    gauge.add_sample("sloserve_metrics_workers_missing", {}, float(missing))
    families[gauge.name] = gauge

    class _Merged:
        def collect(self) -> Iterable[Metric]:
            return families.values()

    return generate_openmetrics(_Merged()) if openmetrics else generate_latest(_Merged())


class MetricsFanIn:
    """A worker's side: answer siblings on its socket; gather everyone's for a scrape."""

    def __init__(self, registry: CollectorRegistry, role: WorkerRole):
        self.registry = registry
        self.role = role
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        path = self.role.metrics_socket(self.role.index)
        path.unlink(missing_ok=True)  # a predecessor that died left it
        self._server = await asyncio.start_unix_server(self._answer, path=str(path))

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:  # the asker names the format first: b"o" OpenMetrics, else the text format
                async with asyncio.timeout(SIBLING_TIMEOUT_S):
                    mode = await reader.read(1)
            except TimeoutError:
                mode = b""
            writer.write(generate_openmetrics(self.registry) if mode == b"o" else generate_latest(self.registry))
            await writer.drain()
        finally:
            writer.close()

    async def _sibling(self, index: int, openmetrics: bool = False) -> str | None:
        try:
            async with asyncio.timeout(SIBLING_TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(str(self.role.metrics_socket(index)))
                try:
                    writer.write(b"o" if openmetrics else b"t")
                    await writer.drain()
                    return (await reader.read()).decode()
                finally:
                    writer.close()
        except (OSError, TimeoutError):
            return None

    async def exposition(self, openmetrics: bool = False) -> bytes:
        others = [i for i in range(self.role.count) if i != self.role.index]
        texts = await asyncio.gather(*(self._sibling(i, openmetrics) for i in others))
        got = {i: t for i, t in zip(others, texts, strict=True) if t is not None}
        own = generate_openmetrics(self.registry) if openmetrics else generate_latest(self.registry)
        got[self.role.index] = own.decode()
        return await asyncio.get_running_loop().run_in_executor(
            None, merge, got, len(others) + 1 - len(got), openmetrics
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        self.role.metrics_socket(self.role.index).unlink(missing_ok=True)
