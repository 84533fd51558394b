"""sloserve/gateway/transports/auth.py without servers: token parsing, constant-time lookup, allow-lists, the ASGI guard."""

from __future__ import annotations

import hmac

import pytest

from sloserve.gateway import tokens
from sloserve.gateway.config import Settings
from sloserve.gateway.errors import PermissionDenied, Unauthenticated
from sloserve.gateway.tokens import TokenTable, bearer_token
from sloserve.gateway.transports.auth import BearerAuthMiddleware
from sloserve.gateway.transports.status import http_status

TEXT = """
# comment line
alpha-token-1   digits,heavy
beta-token-22   *        # every model
gamma-token-333
delta-token-4444  *  training,metrics   # an operator's: no inference
"""


def test_parse_and_allow_lists():
    t = TokenTable.parse(TEXT)
    assert len(t) == 4
    assert t.authorize("Bearer alpha-token-1", "heavy").name == "token#1"
    with pytest.raises(PermissionDenied, match="may not use model 'other'"):
        t.authorize("Bearer alpha-token-1", "other")
    assert t.authorize("bearer beta-token-22", "anything").models is None
    assert t.authorize("Bearer gamma-token-333", "x").models is None
    assert t.authorize("Bearer alpha-token-1", None)  # no model: a valid token suffices
    with pytest.raises(PermissionDenied, match="lacks the 'training' scope"):
        t.authorize("Bearer beta-token-22", None, "training")
    assert t.authorize("Bearer delta-token-4444", None, "metrics").scopes == {"training", "metrics"}


def test_a_token_names_its_tenant_and_admin_is_a_scope():
    t = TokenTable.parse("team-a-token-1 * infer,training team-a\nops-token-0001 * training,admin\n" + TEXT)
    a = t.authorize("Bearer team-a-token-1", None, "training")
    assert (a.tenant, a.admin) == ("team-a", False)
    ops = t.authorize("Bearer ops-token-0001", None, "training")
    assert (ops.tenant, ops.admin) == (None, True)
    assert t.authorize("Bearer delta-token-4444", None, "training").tenant is None


@pytest.mark.parametrize(
    "header, word",
    [
        (None, "missing"),
        ("", "missing"),
        ("Basic abc", "malformed"),
        ("Bearer", "malformed"),
        ("Bearer  ", "malformed"),
        ("Bearer alpha-token-2", "invalid"),
        ("Bearer alpha-token-1x", "invalid"),
        ("Bearer ALPHA-TOKEN-1", "invalid"),
    ],
)
def test_refusals(header, word):
    with pytest.raises(Unauthenticated, match=word) as ei:
        TokenTable.parse(TEXT).authorize(header, "digits")
    assert http_status(ei.value) == 401


@pytest.mark.parametrize(
    "text, msg",
    [
        ("short", "shorter than 8"),
        ("a-long-token b c d e", "expected"),
        ("a-long-token * root", "unknown scope"),
        ("a-long-token * training ../team", "tenant '../team' is not"),
    ],
)
def test_bad_token_files(text, msg):
    with pytest.raises(ValueError, match=msg):
        TokenTable.parse(text)


def test_lookup_compares_against_every_token(monkeypatch):
    """Constant time: compare_digest runs once per configured token, wherever the match is."""
    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(tokens.hmac, "compare_digest", lambda a, b: calls.append(len(a)) or real(a, b))
    t = TokenTable.parse(TEXT)
    for token in ("alpha-token-1", "gamma-token-333", "nope-nope-nope", "x" * 5000):
        calls.clear()
        t.lookup(token)
        assert calls == [32] * 4  # digests: equal lengths whatever the token's length


def test_tokens_kept_only_as_digests():
    t = TokenTable.parse(TEXT)
    assert "alpha-token-1" not in repr(t.__dict__)


def test_from_settings_merges_file_and_env(tmp_path, monkeypatch):
    f = tmp_path / "tokens"
    f.write_text("file-token-1 digits\n")
    monkeypatch.setenv("SLOSERVE_AUTH_TOKENS", "env-token-1 heavy;env-token-2")
    s = Settings(auth_tokens_file=f)
    t = TokenTable.from_settings(s)
    assert len(t) == 3 and t.authorize("Bearer env-token-1", "heavy")
    assert "env-token-1" not in repr(s)  # SecretStr


def test_no_tokens_configured_means_no_table(monkeypatch):
    monkeypatch.delenv("SLOSERVE_AUTH_TOKENS", raising=False)
    assert TokenTable.from_settings(Settings()) is None
    with pytest.raises(ValueError, match="no token"):
        TokenTable.from_settings(Settings(auth_tokens="# only a comment"))


def test_tls_settings_go_in_pairs(tmp_path):
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(ValueError, match="together"):
        Settings(tls_cert_file=cert)
    with pytest.raises(ValueError, match="not a readable file"):
        Settings(tls_cert_file=cert, tls_key_file=tmp_path / "missing.pem")


def test_bearer_token_parsing():
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("  bearer   abc  ") == "abc"
    assert bearer_token("Token abc") is None


# ---- the ASGI guard ----------------------------------------------------------------------------
async def _call(path: str, authorization: str | None = None):
    seen, sent = [], []

    async def app(scope, receive, send):
        seen.append(scope["path"])

    async def send(msg):
        sent.append(msg)

    headers = [(b"authorization", authorization.encode())] if authorization else []
    mw = BearerAuthMiddleware(app, TokenTable.parse(TEXT))
    await mw({"type": "http", "path": path, "headers": headers}, None, send)
    status = sent[0]["status"] if sent else None
    return bool(seen), status


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready", "/v2", "/openapi.json"])
async def test_open_paths(path):
    assert await _call(path) == (True, None)


@pytest.mark.parametrize(
    "path, header, result",
    [
        ("/v2/models/digits/infer", None, (False, 401)),
        ("/v2/models/digits/infer", "Bearer alpha-token-1", (True, None)),
        ("/v2/models/other/infer", "Bearer alpha-token-1", (False, 403)),
        ("/v2/models/other", "Bearer beta-token-22", (True, None)),
        ("/v2/health/live/", None, (False, 401)),
        ("/v2/repository/index", None, (False, 401)),
        ("/v2/models//infer", "Bearer alpha-token-1", (True, None)),
        # scopes: /metrics and /v2/training/* need their own; inference needs infer
        ("/metrics", None, (False, 401)),
        ("/metrics", "Bearer beta-token-22", (False, 403)),
        ("/metrics", "Bearer delta-token-4444", (True, None)),
        ("/v2/training/jobs", "Bearer beta-token-22", (False, 403)),
        ("/v2/training/jobs/j1", "Bearer delta-token-4444", (True, None)),
        ("/v2/models/digits/infer", "Bearer delta-token-4444", (False, 403)),
    ],
)
async def test_protected_paths(path, header, result):
    assert await _call(path, header) == result


async def test_websocket_and_lifespan_scopes_pass_through():
    called = []

    async def app(scope, receive, send):
        called.append(scope["type"])

    await BearerAuthMiddleware(app, TokenTable.parse(TEXT))({"type": "lifespan"}, None, None)
    assert called == ["lifespan"]
