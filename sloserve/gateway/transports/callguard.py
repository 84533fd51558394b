"""gRPC calls that never send their request, and clients that hold too many calls.

grpc.aio calls a unary handler only once the request message is in, but the call holds one of the
server's ``maximum_concurrent_rpcs`` slots from its headers on, and grpc core has no server-side
deadline for a call's messages (the only deadline is the one the client sends, if any). A client
that starts calls and never sends their message would hold every slot for as long as it likes.

:class:`CallGuard` is the outermost server interceptor. It serves every unary method as a
stream-unary one (the same frames on the wire, so clients see no difference): the handler starts
with the call, counts it against the client's address (``max_per_peer``, RESOURCE_EXHAUSTED past
it), reads the one request message within ``message_timeout_s`` (DEADLINE_EXCEEDED after it, and
the slot is free again), then runs the unary handler the inner interceptors built (tokens,
malformed protobuf) on it. Streaming methods are left as they are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from sloserve.gateway.errors import InvalidArgument, RequestTimeout, TooManyRequests
from sloserve.gateway.transports.status import set_grpc_error


def peer_host(peer: str | None) -> str:
    """The client address of a grpc peer string, without its port.

    >>> peer_host("ipv4:127.0.0.1:5123"), peer_host("ipv6:%5B::1%5D:5123"), peer_host("unix:/tmp/s")
    ('127.0.0.1', '::1', 'unix:/tmp/s')
    """
    if not peer:
        return ""
    kind, _, addr = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host = addr.rsplit(":", 1)[0]
        return host.replace("%5B", "").replace("%5D", "").strip("[]")
    return peer


class CallGuard(grpc.aio.ServerInterceptor):
    """A deadline for each unary call's request message, and a cap on calls in flight per client
    address (see the module docstring)."""

    def __init__(self, message_timeout_s: float, max_per_peer: int):
        self.message_timeout_s = message_timeout_s
        self.max_per_peer = max_per_peer
        self.per_peer: dict[str, int] = {}  # calls in flight per client address
        self.timeouts = self.refused = 0

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: grpc.HandlerCallDetails
    ) -> Any:
        handler = await continuation(details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler
        return grpc.stream_unary_rpc_method_handler(
            self._first_message(handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _first_message(self, unary: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
        timeout_s, cap, per_peer = self.message_timeout_s, self.max_per_peer, self.per_peer

        async def first_message(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            peer = peer_host(context.peer())
            n = per_peer.get(peer, 0) + 1
            if n > cap:
                self.refused += 1
                return set_grpc_error(
                    context,
                    TooManyRequests(
                        f"too many calls in flight from {peer} (max_connections_per_client {cap}); "
                        "wait for answers before sending more",
                        retry_after_s=1.0,
                    ),
                )
            per_peer[peer] = n
            try:
                try:
                    async with asyncio.timeout(timeout_s):
                        request = await context.read()
                except TimeoutError:
                    self.timeouts += 1
                    return set_grpc_error(
                        context,
                        RequestTimeout(
                            f"the request message did not arrive within {timeout_s:g} s of the call's start "
                            "(body_timeout_s); send it with the call"
                        ),
                    )
                if request is grpc.aio.EOF:
                    return set_grpc_error(context, InvalidArgument("the call ended without a request message"))
                return await unary(request, context)
            finally:
                left = per_peer.get(peer, 1) - 1
                if left > 0:
                    per_peer[peer] = left
                else:
                    per_peer.pop(peer, None)

        return first_message
