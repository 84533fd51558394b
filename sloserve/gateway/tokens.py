"""Bearer tokens: the configured table (kept as SHA-256 digests) and who each token is.

One entry a line (or ``;``-separated): ``TOKEN [MODELS] [SCOPES] [TENANT]``. ``MODELS`` is a comma list or
``*`` (every model, the default); ``SCOPES`` a comma list of ``infer`` (inference, model
metadata, config and statistics, the default), ``training`` (submit, list and cancel the training
jobs of the token's tenant), ``metrics`` (``/metrics`` and every model's statistics), ``models`` (the repository API:
list the repository, load and unload the models of the token's list) and ``admin`` (with
``training``: every tenant's training jobs). ``TENANT`` names whose training jobs the token
submits and acts on (letters, digits, ``_ . -``); a token without one submits none unless it is
``admin``. The transports check requests against the table (:mod:`sloserve.gateway.transports.auth`);
the settings parse it at start-up so that a bad entry stops the server with a message naming it.

>>> table = TokenTable.parse("s3cret-token digits\\nroot-token-1 * infer,training,metrics team-a")
>>> table.authorize("Bearer s3cret-token", "digits").name
'token#1'
>>> table.authorize("Bearer root-token-1", None, "training").tenant
'team-a'
>>> table.authorize("Bearer s3cret-token", None, "training")
Traceback (most recent call last):
  ...
sloserve.gateway.errors.PermissionDenied: this token lacks the 'training' scope
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sloserve.gateway.errors import PermissionDenied, Unauthenticated

SCOPES = ("infer", "training", "metrics", "models", "admin")
DEFAULT_SCOPES = frozenset({"infer"})
TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # = TrainingSpec.tenant


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a token belongs to: a name for logs (never the token), the models it may use, what
    it may do (:data:`SCOPES`) and the tenant whose training jobs it owns (None: no tenant)."""

    name: str
    models: frozenset[str] | None  # None = every model
    scopes: frozenset[str] = DEFAULT_SCOPES
    tenant: str | None = None

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes


Entry = tuple[str, frozenset[str] | None, frozenset[str], str | None]


def _digest(token: str | bytes) -> bytes:
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


class TokenTable:
    """The configured tokens, kept only as SHA-256 digests."""

    def __init__(self, entries: list[Entry]):
        self._entries = [
            (_digest(tok), Principal(f"token#{i + 1}", models, scopes, tenant))
            for i, (tok, models, scopes, tenant) in enumerate(entries)
        ]

    def __len__(self) -> int:
        return len(self._entries)

    @classmethod
    def parse(cls, text: str, source: str = "auth_tokens") -> TokenTable:
        return cls(_parse_entries(text, source))

    @classmethod
    def from_settings(cls, settings: Any) -> TokenTable | None:
        """The table for ``auth_tokens_file`` + ``auth_tokens``; None when neither is set."""
        texts = []
        if settings.auth_tokens_file is not None:
            texts.append((Path(settings.auth_tokens_file).read_text(), str(settings.auth_tokens_file)))
        if settings.auth_tokens is not None:
            texts.append((settings.auth_tokens.get_secret_value(), "auth_tokens"))
        if not texts:
            return None
        entries: list[Entry] = []
        for text, source in texts:
            entries += _parse_entries(text, source)
        if not entries:
            raise ValueError(
                "authentication is configured but no token was found in " + " and ".join(s for _, s in texts)
            )
        return cls(entries)

    def lookup(self, token: str | None) -> Principal | None:
        """The token's principal, or None; the time taken does not depend on which token matched."""
        if not token:
            return None
        d = _digest(token)
        found = None
        for digest, principal in self._entries:
            if hmac.compare_digest(d, digest) and found is None:
                found = principal
        return found

    def authorize(self, authorization: str | None, model: str | None, scope: str = "infer") -> Principal:
        """Check an ``Authorization`` header value, the scope the request needs, and the model when
        there is one."""
        token = bearer_token(authorization)
        principal = self.lookup(token)
        if principal is None:
            what = "missing" if not authorization else ("malformed" if token is None else "invalid")
            raise Unauthenticated(f"{what} bearer token: send `Authorization: Bearer <token>`")
        if scope not in principal.scopes:
            raise PermissionDenied(f"this token lacks the '{scope}' scope")
        if model is not None and not principal.may_use(model):
            raise PermissionDenied(f"this token may not use model '{model:.128}'")
        return principal


def _parse_entries(text: str, source: str) -> list[Entry]:
    entries: list[Entry] = []
    for n, line in enumerate(text.replace(";", "\n").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) > 4:
            raise ValueError(
                f"{source} entry {n}: expected `TOKEN [model,model...|*] [scope,scope...] [tenant]`, "
                f"got {len(parts)} fields"
            )
        if len(parts[0]) < 8:
            raise ValueError(f"{source} entry {n}: token shorter than 8 characters")
        models: frozenset[str] | None = None
        if len(parts) >= 2 and parts[1] != "*":
            models = frozenset(m for m in parts[1].split(",") if m)
        scopes = DEFAULT_SCOPES
        if len(parts) >= 3:
            scopes = frozenset(x for x in parts[2].split(",") if x)
            unknown = sorted(scopes - set(SCOPES))
            if unknown or not scopes:
                raise ValueError(
                    f"{source} entry {n}: unknown scope {unknown or parts[2]!r}; scopes are {', '.join(SCOPES)}"
                )
        tenant = parts[3] if len(parts) == 4 else None
        if tenant is not None and not TENANT_RE.match(tenant):
            raise ValueError(
                f"{source} entry {n}: tenant {tenant[:70]!r} is not 1-64 letters, digits, '_', '.' or '-' "
                "(first a letter or digit)"
            )
        entries.append((parts[0], models, scopes, tenant))
    return entries


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


# ---- REST: a pure ASGI middleware (no per-request cost when auth is off: it is not installed) ----
