"""One REST infer call from its body and headers to the encoded response: the step the FastAPI route
(sloserve/gateway/transports/rest.py) and the raw-ASGI fast path (sloserve/gateway/transports/fastpath.py)
share."""

from __future__ import annotations

from sloserve.gateway.dataplane import DataPlane
from sloserve.gateway.errors import InvalidArgument, RequestTimeout
from sloserve.gateway.transports.codec import encode_rest
from sloserve.gateway.transports.restdecode import RestDecoder

HEADER_LEN = "inference-header-content-length"

SLO_HEADERS = ("x-slo-ms", "x-min-accuracy", "x-priority", "x-variant", "x-device-type")


def body_timeout(timeout_s: float) -> RequestTimeout:
    return RequestTimeout(
        f"the request body did not arrive within {timeout_s:g} s (body_timeout_s); send it faster, or smaller"
    )


async def infer_body(
    dp: DataPlane,
    decoder: RestDecoder,
    model: str,
    version: str | None,
    arrival: float,
    body: bytes,
    headers,
    on_shed=None,
) -> tuple[bytes, int | None]:
    """One infer call from its body and (lower-case) headers to the encoded response: shared by the
    FastAPI route and the raw-ASGI fast path (sloserve/gateway/transports/fastpath.py), which passes ``on_shed``."""
    hl = headers.get(HEADER_LEN)
    try:
        header_len = int(hl) if hl is not None else None
    except ValueError:
        raise InvalidArgument(f"{HEADER_LEN} {hl!r:.40} is not an integer") from None
    slo_headers = {k: headers[k] for k in SLO_HEADERS if k in headers} or None
    # a model that is not served is refused before the body is decoded; its inputs bound the decoding
    names = dp.input_names(model, version)
    req = decoder.decode_inline(body, header_len, model, version, slo_headers, names)  # (no coroutine: common case)
    if req is None:
        req = await decoder.decode(body, header_len, model, version, slo_headers, names)
    req.arrival_s = arrival
    resp = await dp.infer(req, on_shed)
    return encode_rest(resp)
