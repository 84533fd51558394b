"""Write docs/configuration.md from the settings and model-config schemas (never by hand).

``python -m sloserve.gateway.config_doc > docs/configuration.md``; a unit test checks the file is current.
"""

from __future__ import annotations

import sys

from pydantic import BaseModel

from sloserve.gateway.config import ModelOverride, Settings, TrainingSettings
from sloserve.gateway.config_tracing import TracingSettings
from sloserve.models.repository import ModelConfig, TensorSpec, VariantConfig

HEADER = """# Configuration reference

Generated from the code by `python -m sloserve.gateway.config_doc > docs/configuration.md`; a unit test
fails when it is out of date.

Server settings are resolved once at start-up, in this order (first wins): command-line flags,
environment variables `SLOSERVE_<NAME>` (nested with `__`, e.g. `SLOSERVE_MODELS__DIGITS__SLO_MS=30`),
the `--config` file (`.yaml`, `.toml` or `.json`), defaults. A bad value stops start-up with a
message naming the key and the value, e.g. `http_port='eighty': Input should be a valid integer`.

Per-request parameters (V2 `parameters`, or headers `x-slo-ms`, `x-min-accuracy`,
`x-priority`, `x-variant`, `x-device-type` for clients that cannot set parameters; the body wins).
`timeout` and `priority` are Triton's, as tritonclient and perf_analyzer send them; the others are
sloserve's own:

| parameter | type | meaning |
|---|---|---|
| `slo_ms` | number > 0 | this request's latency budget from arrival at the gateway. Without it the request is best-effort: never refused for a deadline, served behind requests that name one, counted against the model's `slo_ms` in the SLO metrics |
| `min_accuracy` | 0..1 | lowest acceptable variant accuracy; the batcher may degrade down to it under load |
| `priority` | integer | Triton's priority level: 1 the highest, served first; 0 or a level outside 1..`priority_levels` takes the model's `default_priority_level`. Ignored by a model without priority levels (`dynamic_batching.priority_levels` in its config.json or config.pbtxt sets them). Within a level, requests go in deadline order. The `x-priority` header reads the same way: Triton's numbering replaces sloserve's earlier one, where a higher number went first among equal deadlines |
| `timeout` | integer, microseconds | Triton's queue timeout: a request still queued (not dispatched in a batch) this long after it was queued fails with 503 / `UNAVAILABLE` `Request timeout expired` (or, under a config.pbtxt's `timeout_action: DELAY`, waits behind every other). Applies when the model allows overrides (sloserve's own models do; a config.pbtxt needs `allow_timeout_override: true`) and it is shorter than the model's `default_timeout_microseconds`; 0 = none. It bounds the wait only: `slo_ms` stays the deadline the batcher plans for, and a request with a `timeout` and no `slo_ms` stays best-effort |
| `variant` | string | pin a variant; the batcher will not switch it (on a model with several `device_types` it may still pick the type) |
| `device_type` | string | pin the device type of a model served on several (`cpu` names the host's CPU type); an unknown type is a 400 listing the model's types |

Response parameters: `variant`, `accuracy`, `batch_size`, `queue_ms`, `compute_ms`, `device_type`.
"""


DOOR = """
### The event-loop door on a busy host

`loop_lag_shed_ms` (default 5 ms with the in-process backend, off with Ray) refuses requests while
the gateway's own event loop cannot keep up. Past that point every request costs the loop a decode
and an answer whatever the replicas do, and without the door an open-loop client drives the gateway
into collapse: answers come back seconds late instead of being refused at once (docs/benchmarks.md,
"The front end past its capacity").

A timer on the loop also runs late when the loop has nothing to do but another program holds the
core. Refusing clients then shortens nothing. So each lag probe is weighed by the share of its
interval that the loop's thread spent on the CPU (`time.thread_time`), and the door acts on that,
the loop's **own** lag: a loop working through its own backlog runs the whole interval and counts in
full; a loop waiting for a core counts for the little it ran. `sloserve_event_loop_lag_seconds`
still reports the plain lag.

Why the signal and not a higher threshold: a higher threshold would only let the loop fall further
behind before the door acts when the front end really is past its capacity, where the own lag and
the plain lag agree; beside busy programs at light load only the own lag stays quiet.
"""

TRACING = """Each key mirrors an OpenTelemetry SDK variable (named first in its description), and a variable
that is set wins over the key. Tracing is off until an exporter or an OTLP endpoint is named;
`OTEL_SDK_DISABLED=true` turns it off whatever else is set (docs/operations.md, "Tracing").
"""


def table(model: type[BaseModel], prefix: str = "") -> str:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, f in model.model_fields.items():
        ann = getattr(f.annotation, "__name__", None) or str(f.annotation).replace("typing.", "")
        default = "required" if f.is_required() else repr(f.get_default(call_default_factory=True))
        cells = [f"`{prefix}{name}`", f"`{ann}`", f"`{default}`", f.description or ""]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def render() -> str:
    parts = [
        HEADER,
        "## Server settings (`sloserve serve`)\n",
        table(Settings),
        DOOR,
        "\n## Per-model overrides (`models: {<name>: {...}}`)\n",
        table(ModelOverride, "models.<name>."),
        "\n## Training harvest (`training: {...}`)\n",
        table(TrainingSettings, "training."),
        "\n## Tracing (`tracing: {...}`)\n",
        TRACING,
        table(TracingSettings, "tracing."),
        "\n## Model repository: `<repo>/<model>/config.json`\n",
        table(ModelConfig),
        "\n### `variants[]`\n",
        table(VariantConfig),
        "\n### `inputs[]` / `outputs[]`\n",
        table(TensorSpec),
    ]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
