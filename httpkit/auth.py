"""API keys, the internal token, per-key rate limits, and the ASGI guard that applies them.

* **API keys** (gateway): lines ``scope:key`` with scope ``read`` (query, answer, cluster view),
  ``write`` (documents too) or ``admin`` (everything, incl. rollouts and collections), optionally
  followed by ``collections=a+b`` (only those collections, through ``/v1/collections/<name>/…``),
  ``tenant=T`` (only tenant T's documents: serving.gateway.tenancy) and ``rps=N`` (the key's own
  requests-per-second quota, 429 naming it). From ``SHARDRAG_API_KEYS`` (comma-separated) or
  ``SHARDRAG_API_KEYS_FILE`` (one per line, ``#`` comments). Only sha256 digests are kept, and
  a presented key is compared against every digest with ``hmac.compare_digest`` (no early
  exit): the time taken does not depend on which key, or how much of one, matched. Keys are
  never logged; a key is named in logs and metrics by ``key_id`` (first 8 hex of its digest).
* **Internal token** (gateway → shard servers, kv-nodes, generators): ``SHARDRAG_INTERNAL_TOKEN``
  or ``SHARDRAG_INTERNAL_TOKEN_FILE``; sent as ``x-shardrag-token``.
* **Rate limit**: a token bucket per key (per client address when auth is off) → 429 with
  ``Retry-After``.

The environment is read by ``retrieval.env``; the shard server and every serving process use this.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from httpkit.asgi import Receive, Scope, Send
from retrieval import env as environment
from retrieval.errors import ConfigError, Forbidden, QuotaExceeded, RateLimited, ShardragError, Unauthorized

SCOPES = ("read", "write", "admin")  # write: documents in and out (and read); admin: everything
TOKEN_HEADER = b"x-shardrag-token"
TOKEN_HEADER_STR = TOKEN_HEADER.decode()
_OPEN = None  # policy result: no credentials needed


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


@dataclass(frozen=True, slots=True)
class ApiKey:
    scope: str
    digest: bytes
    collections: frozenset[str] | None = None  # the collections it may use (None: every one)
    tenant: str | None = None  # confined to documents of this tenant (serving.gateway.tenancy)
    max_rps: float = 0.0  # its own requests-per-second quota (0: only the gateway-wide rate limit)

    @property
    def key_id(self) -> str:
        return self.digest.hex()[:8]

    @property
    def scoped(self) -> bool:
        """Limited to named collections or to a tenant: such a key uses ``/v1/collections/...`` only."""
        return self.collections is not None or self.tenant is not None


KEY_ATTRIBUTES = ("collections", "tenant", "rps")
SCOPE_KEY = "shardrag.key"  # the ASGI scope entry the guard leaves the caller's ApiKey in


def _parse_entry(number: int, entry: str) -> ApiKey:
    """``scope:secret [collections=a+b] [tenant=acme] [rps=20]`` (names joined by "+": entries of
    SHARDRAG_API_KEYS are comma-separated)"""
    head, *attributes = entry.strip().split()
    scope, sep, secret = head.partition(":")
    if not sep or scope not in SCOPES:
        raise ConfigError(f"API key entry {number} must be 'read:<key>', 'write:<key>' or 'admin:<key>'",
                          field="api_keys")
    if len(secret) < 16:
        raise ConfigError(f"API key entry {number} is shorter than 16 characters", field="api_keys")
    found: dict[str, str] = {}
    for attribute in attributes:
        name, eq, value = attribute.partition("=")
        if not eq or name not in KEY_ATTRIBUTES or not value or name in found:
            raise ConfigError(f"API key entry {number}: {attribute!r} is not one of collections=a+b tenant=T rps=N",
                              field="api_keys")
        found[name] = value
    try:
        max_rps = float(found.get("rps", "0"))
    except ValueError:
        max_rps = -1.0
    if not math.isfinite(max_rps) or max_rps < 0:
        raise ConfigError(f"API key entry {number}: rps must be a number ≥ 0", field="api_keys")
    collections = frozenset(c for c in found["collections"].split("+") if c) if "collections" in found else None
    return ApiKey(scope, _digest(secret), collections, found.get("tenant"), max_rps)


class KeyRing:
    def __init__(self, entries: list[str]) -> None:
        keys = [_parse_entry(number, entry) for number, entry in enumerate(entries, start=1) if entry.strip()]
        if not keys:
            raise ConfigError("no API keys given", field="api_keys")
        self.keys = keys

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KeyRing | None:
        entries = environment.api_key_entries(env)
        return cls(entries) if entries else None

    def find(self, presented: str) -> ApiKey | None:
        digest = _digest(presented)
        found = None
        for key in self.keys:  # every comparison runs, whatever matched
            if hmac.compare_digest(key.digest, digest):
                found = key
        return found


def internal_token_from_env(env: Mapping[str, str] | None = None) -> str | None:
    return environment.internal_token(env)


def internal_headers(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Headers a serving process adds to its calls to other shardrag processes."""
    token = internal_token_from_env(env)
    return {TOKEN_HEADER_STR: token} if token else {}


QuotaShare = Callable[[], float]  # this process's share of a cluster-wide quota (1 / live gateways)


class RateLimiter:
    """Token bucket per caller: ``rate`` requests/s sustained, ``burst`` at once. ``share``: the
    part of both this process enforces (a quota of the whole cluster, split over its live
    gateways; read at every request, so a gateway joining or leaving re-splits it at once)."""

    def __init__(self, rate: float, burst: float, *, clock: Callable[[], float] = time.monotonic,
                 share: QuotaShare | None = None) -> None:
        if rate <= 0 or burst < 1:
            raise ConfigError("rate limit needs rate > 0 and burst ≥ 1", field="rate_limit")
        self.rate, self.burst, self.clock, self.share = rate, burst, clock, share
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, caller: str) -> float:
        """0 if allowed, else the seconds until a request would be."""
        now = self.clock()
        rate, burst = self.rate, self.burst
        if self.share is not None:  # a quota of the whole cluster: this gateway's part of it
            part = max(self.share(), 1e-6)
            if part < 1.0:
                rate, burst = rate * part, burst * part
                if burst < 1.0:
                    burst = 1.0
        with self._lock:
            tokens, last = self._buckets.get(caller, (burst, now))
            tokens = min(burst, tokens + (now - last) * rate)
            if tokens >= 1.0:
                self._buckets[caller] = (tokens - 1.0, now)
                return 0.0
            self._buckets[caller] = (tokens, now)
            return (1.0 - tokens) / rate


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def presented_key(scope: Scope) -> str | None:
    authorization = _header(scope, b"authorization")
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return _header(scope, b"x-api-key")


Policy = Callable[[str, str], str | None]  # (method, path) → None (open), "read", "admin" or "internal"


def gateway_policy(method: str, path: str) -> str | None:
    if path in ("/healthz", "/metrics", "/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect") or \
            (path == "/" and method == "GET"):  # the status page: static; the data behind it needs a key
        return _OPEN
    if path.startswith("/admin"):
        return "admin"
    name, rest = collection_path(path)
    if name is not None and rest == "" and method in ("PUT", "DELETE"):
        return "admin"  # create or drop a collection
    if name is not None and (rest in ("/rollout", "/tune", "/query-defaults") or
                             rest.startswith(("/rollout/", "/backup/"))):
        return "admin"  # a collection's rollouts (as /admin/rollout), tuning, query defaults and backups
    if method == "POST" and (path.startswith("/v1/documents") or rest.startswith("/documents")):
        return "write"
    return "read"


COLLECTIONS_PATH = "/v1/collections/"


def collection_path(path: str) -> tuple[str | None, str]:
    """``/v1/collections/<name><rest>`` → (name, rest); any other path → (None, "")."""
    if not path.startswith(COLLECTIONS_PATH):
        return None, ""
    name, slash, rest = path[len(COLLECTIONS_PATH):].partition("/")
    return (name or None), slash + rest


def check_key_reach(key: ApiKey, method: str, path: str) -> None:
    """A scoped key reaches only its collections, through ``/v1/collections/<name>/…`` (and the list
    of collections, which the gateway filters for it); anything else is 403 naming its scope."""
    if not key.scoped:
        return
    name, rest = collection_path(path)
    if name is None:
        if path == "/v1/collections" and method == "GET":
            return
        raise Forbidden(f"this key is scoped to {_reach(key)}: use /v1/collections/<name>/…", field="authorization")
    if key.collections is not None and name not in key.collections:
        raise Forbidden(f"this key may not use collection {name!r} (it is scoped to {_reach(key)})",
                        field="authorization")
    if key.tenant is not None and rest == "" and method != "GET":
        raise Forbidden("a tenant-scoped key cannot create or drop collections", field="authorization")
    if key.tenant is not None and (rest in ("/rollout", "/tune", "/query-defaults") or rest.startswith("/rollout/")):
        raise Forbidden("a tenant-scoped key cannot run a collection's rollouts, tune it or set its query defaults",
                        field="authorization")


def _reach(key: ApiKey) -> str:
    parts = []
    if key.collections is not None:
        parts.append("collections " + ", ".join(sorted(key.collections)))
    if key.tenant is not None:
        parts.append(f"tenant {key.tenant!r}")
    return " and ".join(parts)


def internal_policy(method: str, path: str) -> str | None:
    """Shard servers, kv-nodes, generators: liveness open (kubelet probes), the rest internal."""
    return _OPEN if path in ("/healthz", "/metrics") else "internal"


class AuthGuard:
    """ASGI middleware in front of a shardrag app: checks credentials per the policy, then the
    rate limit, before the app sees the request. Errors are the usual JSON error bodies."""

    def __init__(self, app: Any, *, policy: Policy, keys: KeyRing | None = None, internal_token: str | None = None,
                 limiter: RateLimiter | None = None, quota_share: QuotaShare | None = None) -> None:
        """``quota_share``: this gateway's share of each key's ``rps`` (None: all of it)."""
        self.quota_share = quota_share
        self.app = app
        self.policy = policy
        self.keys = keys
        self.internal_digest = _digest(internal_token) if internal_token else None
        self.limiter = limiter
        self._key_limiters: dict[bytes, RateLimiter] = {}  # keys with their own rps quota

    def __getattr__(self, name: str) -> Any:  # behave like the wrapped app (routes, openapi, state)
        return getattr(self.app, name)

    @property
    def enabled(self) -> bool:
        return self.keys is not None or self.internal_digest is not None

    def check(self, scope: Scope) -> str | None:
        """The caller's identity for rate limiting, or raises Unauthorized / Forbidden."""
        needed = self.policy(scope.get("method", ""), scope.get("path", ""))
        if needed is _OPEN:
            return None
        if needed == "internal":
            if self.internal_digest is None:
                return None
            token = _header(scope, TOKEN_HEADER)
            if token is None or not hmac.compare_digest(_digest(token), self.internal_digest):
                raise Unauthorized("missing or wrong internal token (x-shardrag-token)", field=TOKEN_HEADER_STR)
            return "internal"
        client = scope.get("client") or ("?", 0)
        if self.keys is None:
            return f"addr:{client[0]}"
        presented = presented_key(scope)
        if not presented:
            raise Unauthorized("an API key is required: send 'Authorization: Bearer <key>'", field="authorization")
        key = self.keys.find(presented)
        if key is None:
            raise Unauthorized("unknown API key", field="authorization")
        if needed == "admin" and key.scope != "admin":
            raise Forbidden(f"{scope.get('method')} {scope.get('path')} needs an admin key; this key is {key.scope}",
                            field="authorization")
        if needed == "write" and key.scope not in ("write", "admin"):
            raise Forbidden(f"{scope.get('method')} {scope.get('path')} needs a write key (or admin); this key is "
                            f"{key.scope}", field="authorization")
        check_key_reach(key, scope.get("method", ""), scope.get("path", ""))
        scope[SCOPE_KEY] = key
        if key.max_rps > 0:
            self._own_quota(key)
        return f"key:{key.key_id}"

    def _own_quota(self, key: ApiKey) -> None:
        limiter = self._key_limiters.get(key.digest)
        if limiter is None:
            limiter = self._key_limiters.setdefault(key.digest, RateLimiter(key.max_rps, max(1.0, key.max_rps),
                                                                                 share=self.quota_share))
        wait_s = limiter.take(key.key_id)
        if wait_s > 0:
            raise QuotaExceeded(f"key {key.key_id} is limited to {key.max_rps:g} requests/s; retry in {wait_s:.2f} s",
                                retry_after_s=wait_s, field="rps")

    def _routed(self, scope: Scope) -> bool:
        """Whether some route serves this method and path. Unknown paths and methods go to the
        app, which answers 404/405 (they reveal nothing and need no key). When in doubt: routed
        (the credentials are checked)."""
        app = self.app
        fast_routes = getattr(app, "routes", None)
        if isinstance(fast_routes, dict):  # a FastPathApp: its hot routes, then its FastAPI app's
            if (scope.get("method"), scope.get("path")) in fast_routes:
                return True
            app = getattr(app, "app", None)
        routes = getattr(app, "routes", None)
        if not isinstance(routes, list) or not routes:
            return True
        try:
            from starlette.routing import Match
        except ImportError:  # pragma: no cover - every shardrag server runs on starlette
            return True
        return any(getattr(route, "matches", None) is None or route.matches(scope)[0] == Match.FULL
                   for route in routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._routed(scope):
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = []
        try:
            caller = self.check(scope)
            if caller is not None and caller != "internal" and self.limiter is not None:
                wait_s = self.limiter.take(caller)
                if wait_s > 0:
                    raise RateLimited(f"rate limit of {self.limiter.rate:g} requests/s (burst {self.limiter.burst:g}) "
                                      f"exceeded; retry in {wait_s:.2f} s", retry_after_s=wait_s)
        except ShardragError as exc:
            if isinstance(exc, RateLimited):
                headers.append((b"retry-after", str(max(1, math.ceil(exc.retry_after_s))).encode()))
            if isinstance(exc, Unauthorized):
                headers.append((b"www-authenticate", b'Bearer realm="shardrag"'))
            await _send_error(send, exc, headers)
            return
        await self.app(scope, receive, send)


async def _send_error(send: Send, exc: ShardragError, headers: list[tuple[bytes, bytes]]) -> None:
    body = orjson.dumps(exc.to_dict())
    await send({"type": "http.response.start", "status": exc.status_code,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


def guard_from_env(app: Any, policy: Policy, *, limiter: RateLimiter | None = None,
                   env: Mapping[str, str] | None = None, with_keys: bool = False,
                   quota_share: QuotaShare | None = None) -> Any:
    """Wrap ``app`` with the credentials the environment configures (unchanged when none and no
    rate limit). ``with_keys``: this process takes API keys (the gateway); ``quota_share``: its
    share of the keys' cluster-wide ``rps`` quotas."""
    keys = KeyRing.from_env(env) if with_keys else None
    token = internal_token_from_env(env)
    if keys is None and token is None and limiter is None:
        return app
    return AuthGuard(app, policy=policy, keys=keys, internal_token=token, limiter=limiter, quota_share=quota_share)
