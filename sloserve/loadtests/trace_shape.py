"""A Locust LoadTestShape that replays an arrival trace, time-compressed and scaled.

    locust -f sloserve/loadtests/locustfile.py,sloserve/loadtests/trace_shape.py --headless -H http://127.0.0.1:8000 \
        --trace-column aggregate_1350fn --trace-start-minute 540 --trace-minutes 15 \
        --seconds-per-minute 1 --peak-rps 150
    locust -f sloserve/loadtests/locustfile.py,sloserve/loadtests/trace_shape.py --headless -H http://127.0.0.1:8000 \
        --trace-file sloserve/loadtests/traces/azure_llm_2023_conv.csv --trace-kind timestamps --trace-column t_s \
        --trace-start-minute 18 --trace-minutes 5 --seconds-per-minute 60 --peak-rps 450

Minutes ``start .. start+minutes-1`` of one column of the trace become ``minutes *
seconds_per_minute`` seconds of test; the busiest bin of the slice (a minute of a per-minute
trace, a second of a timestamp trace) maps to ``--peak-rps`` and the others keep their proportion
(linear interpolation between bins): a timestamp trace replayed at 60 s a minute keeps its
second-to-second clumps. For a timestamp trace the users are a fixed pool of
``ceil(peak_rps / rps_per_user)`` sending open loop (exponential gaps at their share of the
current rate), so the rate can change every second without users starting and stopping. Users pace themselves to
``--rps-per-user`` requests/s (sloserve/loadtests/locustfile.py), so the shape asks for
``ceil(target_rps / rps_per_user)`` users. Options are the locustfile's (``--trace-*``,
``--seconds-per-minute``, ``--peak-rps``; environment variables ``SLOSERVE_TRACE_*`` ...).
The default trace is the Azure Functions 2019 slice in sloserve/loadtests/traces/ (CC-BY-4.0, Shahrad et
al., ATC'20).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from locust import LoadTestShape

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trace_rates import DEFAULT_TRACE, load_bins, load_trace, rate_at

__all__ = ["DEFAULT_TRACE", "TraceShape", "load_bins", "load_trace", "rate_at"]


class TraceShape(LoadTestShape):
    """Users follow the trace; the test ends when the slice does."""

    def tick(self):
        env = self.runner.environment
        o = env.parsed_options
        if not hasattr(self, "_counts"):
            self._counts, self._bin_s = load_bins(
                o.trace_file or DEFAULT_TRACE,
                o.trace_kind,
                o.trace_column,
                o.trace_start_minute,
                o.trace_minutes,
                o.seconds_per_minute,
            )
        rps = rate_at(self._counts, self.get_run_time(), self._bin_s, o.peak_rps)
        if rps is None:
            return None
        env.sloserve_target_rps = round(rps, 2)
        per_user = o.rps_per_user if o.rps_per_user > 0 else 50.0
        if o.trace_kind == "timestamps":  # a fixed pool, open loop: the rate changes every second
            env.sloserve_open_loop = True
            pool = max(1, math.ceil(o.peak_rps / per_user))
            return pool, pool
        users = max(1, math.ceil(rps / per_user))
        return users, max(10, users)
