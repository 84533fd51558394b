"""A stand-in OTLP/HTTP collector for benchmarks of tracing: it accepts every export a traced gateway
posts (``POST /v1/traces``) with 200 and counts the posts and bytes, without decoding them (a real
collector runs elsewhere; here the sink shares the machine with the server and stays cheap)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class OtlpSink:
    def __init__(self) -> None:
        self.posts = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                self.rfile.read(n)
                sink.posts += 1
                sink.bytes += n
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="otlp-sink", daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


_SINK: OtlpSink | None = None


def shared_sink() -> OtlpSink:
    """One sink for the whole benchmark run, started on first use."""
    global _SINK
    if _SINK is None:
        _SINK = OtlpSink()
    return _SINK


def tracing_env(sample_percent: float) -> dict[str, str]:
    """The standard OpenTelemetry variables that turn a gateway's tracing on, exporting to the shared
    sink over OTLP/HTTP and sampling ``sample_percent`` of the requests at their root."""
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": shared_sink().endpoint,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": f"{sample_percent / 100:g}",
    }
