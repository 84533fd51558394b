"""A web page cannot drive a gateway on 127.0.0.1: what a browser sends cross-site without a CORS
preflight (``text/plain``, forms) is 415, a page that rebinds its DNS name to 127.0.0.1 gets 421,
and the clients the gateway serves (tritonclient's HTTP clients, sync and asyncio) work as before.

On the shared in-process server (``sloserve serve`` on 127.0.0.1, no tokens), the ``cnn`` model.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient

pytestmark = pytest.mark.integration


def call(srv, path, method="POST", body=b"", headers=None):
    req = urllib.request.Request(f"http://{srv.http_url}{path}", data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_a_cross_site_post_cannot_unload_a_model(servers):
    srv = servers("inprocess")
    try:
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            status, body = call(srv, "/v2/repository/models/cnn/unload", body=b"{}", headers={"Content-Type": ctype})
            assert status == 415 and "application/json" in json.loads(body)["error"], (ctype, body)
        # a body without a type, from a page: browsers add Origin to every POST
        status, body = call(srv, "/v2/repository/models/cnn/unload", headers={"Origin": "http://evil.example.com"})
        assert status == 415, body
        assert call(srv, "/v2/models/cnn/ready", "GET")[0] == 200  # still loaded
        status, body = call(
            srv, "/v2/models/cnn/infer", body=json.dumps(_json_infer()).encode(), headers={"Content-Type": "text/plain"}
        )
        assert status == 415 and "application/json" in json.loads(body)["error"]
    finally:  # without the check the shared server would have lost the model: put it back
        if call(srv, "/v2/models/cnn/ready", "GET")[0] != 200:
            call(srv, "/v2/repository/models/cnn/load", headers={"Content-Type": "application/json"})


def test_a_rebound_dns_name_is_421(servers):
    srv = servers("inprocess")
    for path, method in (("/v2/health/ready", "GET"), ("/v2/models/cnn", "GET"), ("/v2/repository/index", "POST")):
        status, body = call(
            srv, path, method, headers={"Host": "evil.example.com:8000", "Content-Type": "application/json"}
        )
        assert status == 421, (path, body)
        assert "evil.example.com" in json.loads(body)["error"] and "allowed_hosts" in json.loads(body)["error"]
    for host in ("localhost", f"localhost:{srv.http_port}", "127.0.0.1", f"[::1]:{srv.http_port}"):
        assert call(srv, "/v2/health/ready", "GET", headers={"Host": host})[0] == 200, host


def _json_infer():
    return {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}


def test_tritonclient_http_sync_and_asyncio_still_work(servers):
    """The sync client sends no Content-Type, the asyncio one application/octet-stream: infer (JSON
    and binary), the repository index, load and unload all pass (cnn is unloaded and loaded again)."""
    srv = servers("inprocess")
    x = np.random.default_rng(0).random((2, 64), dtype=np.float32)
    h = httpclient.InferenceServerClient(srv.http_url)
    for binary in (False, True):
        i = httpclient.InferInput("input", [2, 64], "FP32")
        i.set_data_from_numpy(x, binary_data=binary)
        assert h.infer("cnn", [i]).as_numpy("label").shape == (2,)
    assert "cnn" in {m["name"] for m in h.get_model_repository_index()}
    h.load_model("cnn")  # unchanged: stays loaded

    async def aio() -> None:
        c = aioclient.InferenceServerClient(srv.http_url)
        try:
            for binary in (False, True):
                i = aioclient.InferInput("input", [2, 64], "FP32")
                i.set_data_from_numpy(x, binary_data=binary)
                assert (await c.infer("cnn", [i])).as_numpy("label").shape == (2,)
            assert "cnn" in {m["name"] for m in await c.get_model_repository_index()}
            await c.unload_model("cnn")
            assert not await c.is_model_ready("cnn")
            await c.load_model("cnn")
            assert await c.is_model_ready("cnn")
        finally:
            await c.close()

    try:
        asyncio.run(aio())
        h.unload_model("cnn")
        assert not h.is_model_ready("cnn")
    finally:
        h.load_model("cnn")
    assert h.is_model_ready("cnn")
