"""Bearer tokens with model allow-lists, over TLS, on a real server driven by tritonclient.

One in-process-backend server serves REST and gRPC over TLS with a throwaway self-signed
certificate, three tokens (two from a file, one from SLOSERVE_AUTH_TOKENS) and limits set low
enough to trip. Each protected call is tried with the right token, a wrong one, a malformed
header and none; each open endpoint without any.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess

pytestmark = pytest.mark.integration

ALL = "tok-all-7f3c9e21d4"
DIGITS = "tok-digits-5a8b0c61"
HEAVY_ENV = "tok-heavy-env-e2d9"
WRONG = "tok-all-7f3c9e21d5"
ADMIN = "tok-admin-3c1d9e77"  # the repository API, for digits only


def make_cert(d):
    """A throwaway self-signed certificate for 127.0.0.1 / localhost."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = d / "cert.pem", d / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def secure(model_repo, tmp_path_factory):
    d = tmp_path_factory.mktemp("auth")
    cert, key = make_cert(d)
    tokens = d / "tokens"
    tokens.write_text(
        f"# test tokens\n{ALL} * infer,metrics\n{DIGITS} digits   # digits only\n{ADMIN} digits infer,models\n"
    )
    tokens.chmod(0o600)
    srv = ServerProcess(
        model_repo,
        "inprocess",
        env={
            "SLOSERVE_AUTH_TOKENS_FILE": str(tokens),
            "SLOSERVE_AUTH_TOKENS": f"{HEAVY_ENV} heavy",
            "SLOSERVE_TLS_CERT_FILE": str(cert),
            "SLOSERVE_TLS_KEY_FILE": str(key),
            "SLOSERVE_MAX_BATCH_ROWS": "8",
            "SLOSERVE_MAX_TENSOR_ELEMENTS": "4096",
            "SLOSERVE_ALLOW_NONFINITE": "false",  # on by default, as in Triton
        },
    )
    ctx = ssl.create_default_context(cafile=str(cert))
    deadline = time.monotonic() + 120
    while True:
        if srv.proc.poll() is not None:
            raise RuntimeError(srv.output())
        try:
            with urllib.request.urlopen(f"https://{srv.http_url}/v2/health/ready", context=ctx, timeout=1) as r:
                if r.status == 200:
                    break
        except (urllib.error.URLError, OSError):
            pass
        assert time.monotonic() < deadline, srv.output()
        time.sleep(0.1)
    yield srv, cert, ctx
    srv.stop()


def _get(secure, path, token=None, raw_auth=None):
    srv, _, ctx = secure
    req = urllib.request.Request(f"https://{srv.http_url}{path}")
    if token or raw_auth:
        req.add_header("Authorization", raw_auth or f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def http_client(secure):
    srv, cert, _ = secure
    return httpclient.InferenceServerClient(
        srv.http_url, ssl=True, ssl_context_factory=lambda: ssl.create_default_context(cafile=str(cert))
    )


def grpc_client(secure):
    srv, cert, _ = secure
    return grpcclient.InferenceServerClient(srv.grpc_url, ssl=True, root_certificates=str(cert))


def x(n=1, cols=64):
    return np.random.default_rng(0).random((n, cols), dtype=np.float32) * 16


def http_infer(secure, model, token=None, data=None, headers=None):
    data = x(1, 64 if model == "digits" else 1024) if data is None else data
    i = httpclient.InferInput("input", list(data.shape), "FP32")
    i.set_data_from_numpy(data, binary_data=True)
    h = dict(headers or {})
    if token:
        h["Authorization"] = f"Bearer {token}"
    return http_client(secure).infer(model, [i], headers=h)


def grpc_infer(secure, model, token=None, data=None):
    data = x(1, 64 if model == "digits" else 1024) if data is None else data
    i = grpcclient.InferInput("input", list(data.shape), "FP32")
    i.set_data_from_numpy(data)
    return grpc_client(secure).infer(model, [i], headers={"authorization": f"Bearer {token}"} if token else None)


# ---- REST ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready", "/v2", "/openapi.json"])
def test_open_endpoints_need_no_token(secure, path):
    assert _get(secure, path)[0] == 200


def test_metrics_need_the_metrics_scope(secure):
    """/metrics lists models, variants and job ids: only a token with the metrics scope reads it."""
    assert _get(secure, "/metrics")[0] == 401
    assert _get(secure, "/metrics", DIGITS)[0] == 403
    status, body = _get(secure, "/metrics", ALL)[:2]
    assert status == 200 and b"sloserve_requests_total" in body


@pytest.mark.parametrize(
    "token, raw, status, needle",
    [
        (None, None, 401, "missing bearer token"),
        (WRONG, None, 401, "invalid bearer token"),
        (None, f"Basic {ALL}", 401, "malformed bearer token"),
        (None, "Bearer", 401, "malformed bearer token"),
        (ALL, None, 200, None),
        (DIGITS, None, 200, None),
        (HEAVY_ENV, None, 403, "may not use model 'digits'"),
    ],
)
def test_rest_model_metadata_tokens(secure, token, raw, status, needle):
    code, body, headers = _get(secure, "/v2/models/digits", token, raw)
    assert code == status, body
    if needle:
        assert needle in json.loads(body)["error"]
    if status == 401:
        assert headers.get("www-authenticate", headers.get("WWW-Authenticate", "")).startswith("Bearer")


def test_rest_infer_right_token_and_allow_list(secure):
    assert http_infer(secure, "digits", ALL).as_numpy("label").shape == (1,)
    assert http_infer(secure, "digits", DIGITS).as_numpy("probs").shape == (1, 10)
    assert http_infer(secure, "heavy", HEAVY_ENV).as_numpy("probs").shape == (1, 10)


@pytest.mark.parametrize(
    "model, token, code",
    [("digits", None, "401"), ("digits", WRONG, "401"), ("heavy", DIGITS, "403"), ("digits", HEAVY_ENV, "403")],
)
def test_rest_infer_refused(secure, model, token, code):
    with pytest.raises(InferenceServerException) as ei:
        http_infer(secure, model, token)
    assert ei.value.status() == code and "token" in ei.value.message()


def test_rest_unknown_paths_are_protected_too(secure):
    """Default deny: only the listed endpoints are open; anything else needs a token first."""
    assert _get(secure, "/v2/no/such/endpoint")[0] == 401
    assert _get(secure, "/v2/no/such/endpoint", ALL)[0] == 404
    assert _get(secure, "/v2/models/heavy/ready", DIGITS)[0] == 403
    assert _get(secure, "/v2/models/nope/ready", DIGITS)[0] == 403  # no probing the model list


# ---- gRPC ---------------------------------------------------------------------------------------
def test_grpc_open_rpcs_need_no_token(secure):
    c = grpc_client(secure)
    assert c.is_server_live() and c.is_server_ready()
    assert c.get_server_metadata().name == "sloserve"


@pytest.mark.parametrize(
    "model, token, code",
    [
        ("digits", None, "StatusCode.UNAUTHENTICATED"),
        ("digits", WRONG, "StatusCode.UNAUTHENTICATED"),
        ("heavy", DIGITS, "StatusCode.PERMISSION_DENIED"),
        ("digits", HEAVY_ENV, "StatusCode.PERMISSION_DENIED"),
    ],
)
def test_grpc_infer_refused(secure, model, token, code):
    with pytest.raises(InferenceServerException) as ei:
        grpc_infer(secure, model, token)
    assert ei.value.status() == code and "token" in ei.value.message()


def test_grpc_infer_and_metadata_with_right_token(secure):
    assert grpc_infer(secure, "digits", DIGITS).as_numpy("probs").shape == (1, 10)
    assert grpc_infer(secure, "heavy", ALL).as_numpy("label").shape == (1,)
    c = grpc_client(secure)
    assert c.get_model_metadata("digits", headers={"authorization": f"Bearer {DIGITS}"}).name == "digits"
    with pytest.raises(InferenceServerException, match="UNAUTHENTICATED|token"):
        c.get_model_metadata("digits")
    with pytest.raises(InferenceServerException, match="PERMISSION_DENIED|may not use"):
        c.is_model_ready("heavy", headers={"authorization": f"Bearer {DIGITS}"})


def _post(secure, path, token=None, body=b"{}"):
    srv, _, ctx = secure
    req = urllib.request.Request(
        f"https://{srv.http_url}{path}", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_repository_api_needs_the_models_scope_and_the_allow_list(secure):
    """Loading and unloading change the server: only a token with the ``models`` scope may, and only
    for the models of its list; every model's statistics need the ``metrics`` scope."""
    assert _post(secure, "/v2/repository/index")[0] == 401
    status, body = _post(secure, "/v2/repository/index", ALL)
    assert status == 403 and b"'models' scope" in body
    status, body = _post(secure, "/v2/repository/index", ADMIN)
    assert status == 200 and [m["name"] for m in json.loads(body)] == ["digits"]  # its list only
    status, body = _post(secure, "/v2/repository/models/heavy/unload", ADMIN)
    assert status == 403 and b"may not use model 'heavy'" in body
    assert _post(secure, "/v2/repository/models/digits/load", ADMIN)[0] == 200  # unchanged: stays loaded
    assert _get(secure, "/v2/models/stats", DIGITS)[0] == 403
    assert _get(secure, "/v2/models/stats", ALL)[0] == 200
    assert _get(secure, "/v2/models/digits/stats", DIGITS)[0] == 200
    assert _get(secure, "/v2/models/heavy/config", DIGITS)[0] == 403
    c = grpc_client(secure)
    with pytest.raises(InferenceServerException, match="'models' scope"):
        c.get_model_repository_index(headers={"authorization": f"Bearer {ALL}"})
    names = [m.name for m in c.get_model_repository_index(headers={"authorization": f"Bearer {ADMIN}"}).models]
    assert names == ["digits"]
    with pytest.raises(InferenceServerException, match="may not use model 'heavy'"):
        c.unload_model("heavy", headers={"authorization": f"Bearer {ADMIN}"})
    with pytest.raises(InferenceServerException, match="'metrics' scope"):
        c.get_inference_statistics(headers={"authorization": f"Bearer {DIGITS}"})
    assert c.get_inference_statistics(headers={"authorization": f"Bearer {ALL}"}).model_stats
    assert c.get_inference_statistics("digits", headers={"authorization": f"Bearer {DIGITS}"}).model_stats


def test_grpc_garbage_protobuf_is_invalid_argument(secure):
    srv, cert, _ = secure
    creds = grpc.ssl_channel_credentials(cert.read_bytes())
    with grpc.secure_channel(srv.grpc_url, creds) as ch:
        call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for data in (b"\xff\xff\xff", b"\x0a\x05ab"):
            with pytest.raises(grpc.RpcError) as ei:
                call(data, timeout=10, metadata=(("authorization", f"Bearer {ALL}"),))
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value
            assert "malformed protobuf" in ei.value.details()
        with pytest.raises(grpc.RpcError) as ei:  # no token: refused before parsing anything
            call(b"\xff\xff\xff", timeout=10)
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED


# ---- TLS and limits -----------------------------------------------------------------------------
def test_plaintext_is_refused_on_tls_ports(secure):
    srv = secure[0]
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"http://{srv.http_url}/v2/health/live", timeout=5).read()
    with pytest.raises(InferenceServerException):
        grpcclient.InferenceServerClient(srv.grpc_url).is_server_live(client_timeout=5)


def test_batch_and_element_limits(secure):
    with pytest.raises(InferenceServerException, match="max_batch_rows") as ei:
        http_infer(secure, "digits", ALL, data=x(9))
    assert ei.value.status() == "400"
    with pytest.raises(InferenceServerException, match="max_tensor_elements") as ei:
        grpc_infer(secure, "heavy", ALL, data=x(5, 1024))
    assert "INVALID_ARGUMENT" in str(ei.value.status())
    nan = x(1)
    nan[0, 3] = np.nan
    for call in (http_infer, grpc_infer):
        with pytest.raises(InferenceServerException, match="allow_nonfinite"):
            call(secure, "digits", ALL, data=nan)
