"""An infer request checked against the model it names: its inputs against the model's metadata, and
the variants (or serving options) that may answer it."""

from __future__ import annotations

import numpy as np

from sloserve.batching.options import split_key, variant_of
from sloserve.gateway.errors import InvalidArgument
from sloserve.gateway.modelstate import ModelState
from sloserve.gateway.types import InferRequest


def validate(m: ModelState, req: InferRequest) -> tuple[dict[str, np.ndarray], int]:
    """Check inputs against the model's metadata; return the arrays and the batch rows."""
    cfg = m.config
    unknown = [n for n in req.inputs if n not in m.inputs]
    if unknown:
        raise InvalidArgument(f"model '{cfg.name}' has no input '{unknown[0]:.64}'; inputs: {list(m.inputs)}")
    arrays: dict[str, np.ndarray] = {}
    rows = None
    for name, spec in m.inputs.items():
        if name not in req.inputs:
            raise InvalidArgument(
                f"missing input '{name}' ({spec.datatype}, shape [-1, {', '.join(map(str, spec.shape))}])"
            )
        datatype, arr = req.inputs[name]
        if datatype != spec.datatype:
            raise InvalidArgument(f"input '{name}' has datatype {datatype}; model '{cfg.name}' expects {spec.datatype}")
        want = [-1, *spec.shape]
        wire = m.wire_inputs.get(name)
        if wire is not None and _fits(arr.shape, [-1, *wire]):
            arr = _reshape(arr, spec.shape, name)  # Triton's reshape: the model takes the config's reshape
        elif not _fits(arr.shape, want):
            raise InvalidArgument(
                f"input '{name}' has shape {list(arr.shape)}; model '{cfg.name}' expects "
                f"{[-1, *wire] if wire is not None else want} (first dimension = batch rows, 1..{cfg.max_batch_size})"
            )
        n = arr.shape[0]
        if n < 1:
            raise InvalidArgument(f"input '{name}' has an empty batch (shape {list(arr.shape)})")
        if n > cfg.max_batch_size:
            raise InvalidArgument(
                f"input '{name}' carries {n} rows, over model '{cfg.name}' max_batch_size "
                f"{cfg.max_batch_size}; split the request"
            )
        if rows is None:
            rows = n
        elif n != rows:
            raise InvalidArgument(f"inputs disagree on the batch dimension ({rows} vs {n} rows)")
        arrays[name] = arr
    if req.outputs is not None:
        for o in req.outputs:
            if o.name not in m.outputs:
                raise InvalidArgument(f"model '{cfg.name}' has no output '{o.name:.64}'; outputs: {list(m.outputs)}")
    return arrays, rows or 0


def _fits(shape: tuple[int, ...], want: list[int]) -> bool:
    return len(shape) == len(want) and all(w == -1 or w == d for w, d in zip(want, shape, strict=True))


def _reshape(arr: np.ndarray, shape: tuple[int, ...], name: str) -> np.ndarray:
    """``arr``'s rows in ``shape`` (a view); a clear error when the elements do not fit it."""
    try:
        return arr.reshape(arr.shape[0], *shape)
    except ValueError:
        raise InvalidArgument(
            f"input '{name}' has shape {list(arr.shape)}, whose rows do not reshape to {list(shape)}"
        ) from None


def to_wire(m: ModelState, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The answer's tensors in the shapes clients see: a Triton output whose config 'reshape' differs
    from its 'dims' goes back in the dims, as Triton sends it."""
    if not m.wire_outputs:
        return outputs
    out = dict(outputs)
    for name, dims in m.wire_outputs.items():
        arr = out.get(name)
        if arr is not None and arr.ndim >= 1 and sum(d < 0 for d in dims) <= 1:
            try:
                out[name] = arr.reshape(arr.shape[0], *dims)
            except ValueError:  # a model that answers another size than its config says: left as it is
                pass
    return out


def allowed_variants(m: ModelState, req: InferRequest) -> tuple[str, ...]:
    """The keys that may serve ``req``, best first: its variants (pinned, at or above
    ``min_accuracy``, or all), each on its device types in the backend's order for a model on several
    (only the pinned ``device_type`` when it names one). A pinned variant runs on all its
    options; otherwise only the fallback chain's (dominated options left out)."""
    variants = _variants(m, req)
    pin = req.params.device_type
    if m.plan is None:
        if pin is not None:
            _device_type(m, pin)  # one type: only it may be pinned
        return variants
    dev = _device_type(m, pin) if pin is not None else None
    pinned = pinned_variant(m, req) is not None
    keys = tuple(
        k for v in variants for k in m.plan.of_variant(v, pinned=pinned) if dev is None or split_key(k, "")[1] == dev
    )
    if not keys:  # (a dominated option's dominator is on the same type: not reached with a known type)
        served = sorted({variant_of(k) for k in m.keys if dev is None or split_key(k, "")[1] == dev})
        where = f" on device type '{dev}'" if dev is not None else ""
        raise InvalidArgument(f"model '{m.config.name}' serves none of {list(variants)}{where}; it serves {served}")
    return keys


def _device_type(m: ModelState, name: str) -> str:
    """The model's device type ``name`` names (its profile name, any case; ``cpu`` for the CPU's)."""
    n = name.lower()
    for d in m.device_types:
        if d == n or (n == "cpu" and d.startswith("cpu")):
            return d
    raise InvalidArgument(
        f"unknown device_type '{name:.64}' for model '{m.config.name}'; device types: {list(m.device_types)}"
    )


def pinned_variant(m: ModelState, req: InferRequest) -> str | None:
    """The variant ``req`` pins: its ``variant`` parameter, or for a Triton model (whose versions are
    its variants) the version it names; the two, when both are given, must agree."""
    v = req.params.variant
    if m.triton is None or not req.version:
        return v
    if v is not None and v != req.version:
        raise InvalidArgument(
            f"model '{m.config.name}': model_version '{req.version:.32}' and variant '{v:.64}' differ "
            "(a Triton model's versions are its variants)"
        )
    return req.version


def _variants(m: ModelState, req: InferRequest) -> tuple[str, ...]:
    p = req.params
    pinned = pinned_variant(m, req)
    if pinned is not None:
        if pinned not in m.accuracy:
            raise InvalidArgument(
                f"unknown variant '{pinned:.64}' for model '{m.config.name}'; variants: {m.by_accuracy}"
            )
        if p.min_accuracy is not None and m.accuracy[pinned] < p.min_accuracy:
            raise InvalidArgument(
                f"variant '{pinned}' has accuracy {m.accuracy[pinned]:.4f}, below the "
                f"min_accuracy {p.min_accuracy} asked for"
            )
        return (pinned,)
    if m.triton is not None and not m.triton.variant_fallback:
        best = m.default_variants[0]  # a Triton model without fallback: the default version only
        if p.min_accuracy is not None and m.accuracy[best] < p.min_accuracy:
            raise InvalidArgument(
                f"version '{best}' of '{m.config.name}' has accuracy {m.accuracy[best]:.4f}, below the "
                f"min_accuracy {p.min_accuracy} asked for"
            )
        return (best,)
    if p.min_accuracy is not None:
        ok = tuple(v for v in m.default_variants if m.accuracy[v] >= p.min_accuracy)
        if not ok:
            best = m.by_accuracy[0]
            raise InvalidArgument(
                f"no variant of '{m.config.name}' reaches min_accuracy {p.min_accuracy}; the best is "
                f"'{best}' at {m.accuracy[best]:.4f}"
            )
        return ok
    return m.default_variants
