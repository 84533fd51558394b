"""The REST front door (sloserve/gateway/transports/door.py): the Host a request names and the Content-Type of
a state-changing request, alone and in front of the served app, where the infer fast path and the
repository API sit behind it.

What web pages can send: a cross-site request without a CORS preflight may only use GET, HEAD or
POST with Content-Type ``text/plain``, ``application/x-www-form-urlencoded`` or
``multipart/form-data`` (or a body with no type at all, and then with an ``Origin`` header); a page
that rebinds its own DNS name to 127.0.0.1 sends its own name as Host. What the clients send:
tritonclient's sync HTTP client (geventhttpclient) sends no Content-Type on any POST, its asyncio
client (aiohttp, bytes bodies) ``application/octet-stream`` on every POST, both without Origin.
"""

from __future__ import annotations

import shutil

import httpx
import pytest

from sloserve.gateway.backends.threads import InProcessBackend
from sloserve.gateway.config import Settings
from sloserve.gateway.dataplane import DataPlane
from sloserve.gateway.transports.door import FrontDoor, host_name
from sloserve.gateway.transports.rest import create_asgi
from sloserve.models.repository import ModelRepository
from sloserve.replica.runtime import RuntimeOptions


async def _inner(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"inner"})


async def call(door, method="POST", path="/v2/repository/models/cnn/unload", headers=()):
    sent = []

    async def send(msg):
        sent.append(msg)

    scope = {"type": "http", "method": method, "path": path, "headers": [(k.encode(), v.encode()) for k, v in headers]}
    await door(scope, None, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body.decode()


LOOPBACK = FrontDoor(_inner, loopback=True)
HOST = ("host", "127.0.0.1:8000")


@pytest.mark.parametrize(
    "ctype",
    [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/xml",
        "application/json, text/plain",
        "",
    ],
)
async def test_a_state_changing_request_a_web_page_can_send_is_415(ctype):
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        status, body = await call(LOOPBACK, method, headers=[HOST, ("content-type", ctype)])
        assert status == 415 and "application/json" in body, (method, ctype, body)


@pytest.mark.parametrize(
    "headers",
    [
        [("content-type", "application/json")],
        [("content-type", "Application/JSON; charset=utf-8")],
        [("content-type", "application/octet-stream"), ("inference-header-content-length", "120")],
        [("content-type", "application/octet-stream")],  # tritonclient.http.aio: every POST
        [],  # tritonclient.http (sync): no Content-Type on any POST; curl -X POST without -H
        [("inference-header-content-length", "120")],  # tritonclient.http infer with binary data
        [("origin", "http://127.0.0.1:8000")],  # a page of this server's own (/docs)
        [("origin", "http://evil.example.com"), ("content-type", "application/json")],  # preflighted: never granted
    ],
)
async def test_what_the_clients_send_passes(headers):
    assert await call(LOOPBACK, headers=[HOST, *headers]) == (200, "inner")


@pytest.mark.parametrize("origin", ["http://evil.example.com", "null", "http://localhost:3000"])
async def test_a_body_without_a_type_from_another_site_is_415(origin):
    status, body = await call(LOOPBACK, headers=[HOST, ("origin", origin)])
    assert status == 415 and "web page" in body and "application/json" in body


async def test_reads_need_no_content_type():
    for method in ("GET", "HEAD", "OPTIONS"):
        assert await call(LOOPBACK, method, "/v2/models/cnn", [HOST, ("content-type", "text/plain")]) == (200, "inner")


@pytest.mark.parametrize(
    "host",
    ["localhost", "localhost:8000", "LOCALHOST", "127.0.0.1", "127.0.0.1:80", "127.9.8.7:1", "[::1]", "[::1]:8000"],
)
async def test_loopback_hosts_pass(host):
    assert await call(LOOPBACK, "GET", "/v2", [("host", host)]) == (200, "inner")


@pytest.mark.parametrize(
    "host",
    [
        "evil.example.com",
        "evil.example.com:8000",
        "localhost.evil.example.com",
        "127.0.0.1.nip.io",
        "10.0.0.1:8000",
        "0.0.0.0:8000",
        "[::2]:8000",
        "",
        "127.0.0.1:8000:9",
    ],
)
async def test_any_other_host_is_421_on_a_loopback_bind(host):
    for method in ("GET", "POST"):
        status, body = await call(LOOPBACK, method, "/v2", [("host", host), ("content-type", "application/json")])
        assert status == 421 and "allowed_hosts" in body, (host, body)


async def test_allowed_hosts():
    door = FrontDoor(_inner, loopback=True, allowed_hosts=["gw.example.com", "[fd00::1]"])
    for host in ("gw.example.com", "GW.example.com:443", "[fd00::1]:8000", "localhost"):
        assert await call(door, "GET", "/v2", [("host", host)]) == (200, "inner")
    status, body = await call(door, "GET", "/v2", [("host", "evil.example.com")])
    assert status == 421 and "gw.example.com" in body
    anyhost = FrontDoor(_inner, loopback=True, allowed_hosts=["*"])
    assert await call(anyhost, "GET", "/v2", [("host", "evil.example.com")]) == (200, "inner")


async def test_beyond_loopback_the_host_is_checked_only_against_a_list():
    open_door = FrontDoor(_inner, loopback=False)
    assert await call(open_door, "GET", "/v2", [("host", "gw.example.com")]) == (200, "inner")
    listed = FrontDoor(_inner, loopback=False, allowed_hosts=["gw.example.com"])
    assert await call(listed, "GET", "/v2", [("host", "gw.example.com:8000")]) == (200, "inner")
    assert (await call(listed, "GET", "/v2", [("host", "10.1.2.3")]))[0] == 421
    # the Content-Type rule holds on every bind
    assert (await call(open_door, headers=[("host", "gw.example.com"), ("content-type", "text/plain")]))[0] == 415


async def test_no_host_header_passes():
    """HTTP/1.0 without Host: no browser sends that, so it is no rebinding."""
    assert await call(LOOPBACK, "GET", "/v2", []) == (200, "inner")


async def test_a_refused_host_is_refused_every_time_and_a_good_one_is_remembered():
    door = FrontDoor(_inner, loopback=True)
    for _ in range(3):
        assert (await call(door, "GET", "/v2", [("host", "evil.example.com")]))[0] == 421
        assert (await call(door, "GET", "/v2", [HOST]))[0] == 200
    assert door._good_hosts == {b"127.0.0.1:8000"}


def test_host_name():
    assert host_name(" Example.COM:80 ") == "example.com"
    assert host_name("[::ffff:127.0.0.1]:1") == "::ffff:127.0.0.1"


def test_settings_allowed_hosts():
    assert Settings(allowed_hosts=["gw.example.com", "*"]).allowed_hosts == ["gw.example.com", "*"]
    for bad in ("http://gw.example.com", "gw.example.com/x", "a b", ""):
        with pytest.raises(ValueError, match="allowed_hosts"):
            Settings(allowed_hosts=[bad])


# ---- in front of the served app ---------------------------------------------------------------
@pytest.fixture(scope="module")
def served_app(model_repo, tmp_path_factory):
    """The ASGI app `sloserve serve` runs, over a data plane that is not started: whatever passes the
    door gets the app's own answer (400 for a body it cannot use, 503 while starting), whatever the
    door refuses never reaches it."""
    root = tmp_path_factory.mktemp("door") / "repo"
    shutil.copytree(model_repo / "digits", root / "digits")
    repo = ModelRepository(root).load()
    settings = Settings(repo=root, backend="inprocess")
    return create_asgi(DataPlane(repo, InProcessBackend(repo, RuntimeOptions(device="cpu")), settings))


async def _post(app, path, headers, content=b"{}", url="http://127.0.0.1:8000"):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=url) as c:
        return await c.post(path, content=content, headers=headers)


@pytest.mark.parametrize(
    "path",
    ["/v2/repository/models/digits/unload", "/v2/repository/models/digits/load", "/v2/repository/index"],
)
async def test_the_repository_api_refuses_what_a_web_page_sends(served_app, path):
    r = await _post(served_app, path, {"content-type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["error"]
    r = await _post(served_app, path, {"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415
    for ok in ({"content-type": "application/json"}, {"content-type": "application/octet-stream"}, {}):
        assert (await _post(served_app, path, ok)).status_code != 415


async def test_infer_on_the_fast_path_refuses_what_a_web_page_sends(served_app):
    path = "/v2/models/digits/infer"
    r = await _post(served_app, path, {"content-type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["error"]
    binary = {"content-type": "application/octet-stream", "inference-header-content-length": "2"}
    for ok in ({"content-type": "application/json"}, binary, {"inference-header-content-length": "2"}, {}):
        r = await _post(served_app, path, ok)
        assert r.status_code in (400, 503) and "Content-Type" not in r.json()["error"], r.text  # past the door


async def test_a_rebound_name_is_421_before_anything_else(served_app):
    for path in ("/v2/models/digits/infer", "/v2/repository/models/digits/unload", "/v2/health/live"):
        r = await _post(served_app, path, {"host": "evil.example.com:8000", "content-type": "application/json"})
        assert r.status_code == 421 and "evil.example.com" in r.json()["error"]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=served_app), base_url="http://localhost:8000") as c:
        assert (await c.get("/v2/health/live")).status_code == 200
        assert (await c.get("/v2/health/live", headers={"host": "evil.example.com"})).status_code == 421
