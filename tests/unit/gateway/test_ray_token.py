"""The embedded Ray's token authentication (sloserve/gateway/backends/ray_local.py, ``owner_only_token``): on
unless the operator turned it off, with a token file only its owner may read."""

from __future__ import annotations

import stat

import pytest

from sloserve.gateway.backends.ray_local import owner_only_token


@pytest.fixture
def env(monkeypatch):
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_missing_token_is_created_owner_only_and_token_mode_is_set(env, tmp_path):
    import os

    path = owner_only_token(home=tmp_path)
    assert path == tmp_path / ".ray" / "auth_token"
    assert mode(path) == 0o600 and len(path.read_text()) == 64
    assert os.environ["RAY_AUTH_MODE"] == "token"
    assert owner_only_token(home=tmp_path) == path and len(path.read_text()) == 64  # kept, not replaced


def test_a_token_others_can_read_is_made_owner_only(env, tmp_path):
    path = tmp_path / ".ray" / "auth_token"
    path.parent.mkdir()
    path.write_text("x" * 64)
    path.chmod(0o644)
    assert owner_only_token(home=tmp_path) == path
    assert mode(path) == 0o600 and path.read_text() == "x" * 64


def test_the_operators_choices_are_kept(env, tmp_path):
    env.setenv("RAY_AUTH_MODE", "disabled")
    assert owner_only_token(home=tmp_path) is None and not (tmp_path / ".ray").exists()
    env.setenv("RAY_AUTH_MODE", "token")
    env.setenv("RAY_AUTH_TOKEN", "from-a-secret")
    assert owner_only_token(home=tmp_path) is None
    env.delenv("RAY_AUTH_TOKEN")
    env.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "elsewhere" / "token"))
    path = owner_only_token(home=tmp_path)
    assert path == tmp_path / "elsewhere" / "token" and mode(path) == 0o600
