"""API keys (docs/ARCHITECTURE.md, "API keys"): which callers may use the service, and the
ASGI middleware that refuses the others before any route code runs.

Keys come from a file or an environment variable (ranker_contract/config.py, AuthConfig), one
`id:key` (or `id key`) entry each, optionally followed by the key's quota (`rpm=N tpm=N`,
serve_app/quotas.py) and priority class (`priority=bulk`; online by default); the id names the
calling team in metrics and logs, the key itself is never logged, counted or echoed. Only
SHA-256 digests of the keys are kept, and a presented key is compared with every one of them
with hmac.compare_digest: the time taken does not depend on which key, or how much of one,
matched.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from starlette.responses import JSONResponse

from ranker_contract.config import AuthConfig
from serve_app.protocol import ApiError
from serve_app.quotas import NO_QUOTA, Quota, parse_quota

logger = logging.getLogger(__name__)

NO_KEY = "none"  # the `key` label while auth is off (and for /health, never checked)
REFUSED_KEY = "-"  # the `key` label of a request refused for a missing or wrong key
OPEN_PATHS = frozenset({"/health"})  # everything else needs a key, unknown routes included
KEY_ID_SCOPE = "ranker.api_key_id"  # where the middleware leaves the caller's id for the routes
MIN_KEY_CHARS = 16
PRIORITY_FIELD, PRIORITIES = "priority=", ("online", "bulk")
RELOAD_CHECK_S = 1.0  # the key file's mtime is looked at most this often
_ENTRY = re.compile(r"(?P<id>[A-Za-z0-9_.-]{1,64})\s*[:\s]\s*(?P<key>\S+)(?P<fields>(\s+\S+)*)")


@dataclass(frozen=True, slots=True)
class ApiKey:
    digest: bytes  # SHA-256 of the key
    quota: Quota = NO_QUOTA
    bulk: bool = False  # priority=bulk: its work runs in what online work leaves (ScoreJob.bulk)


def parse_keys(text: str, source: str, commas: bool = False) -> dict[str, ApiKey]:
    """id -> its key's digest, quota and priority class, from `id:key` / `id key` entries,
    each optionally followed by `rpm=N`, `tpm=N` and `priority=online|bulk` (one a line, or
    also comma-separated for an environment variable; # starts a comment line). Raises
    ValueError naming `source` and the line, never the key."""
    entries = re.split(r"[\n,]" if commas else r"\n", text)
    keys: dict[str, ApiKey] = {}
    for number, entry in enumerate(entries, 1):
        entry = entry.strip()
        if not entry or entry.startswith("#"):
            continue
        match = _ENTRY.fullmatch(entry)
        if match is None:
            raise ValueError(f"{source}, entry {number}: not `id:key` (an id of letters, digits, "
                             "'_', '.', '-', then a key without spaces)")
        key_id, key = match["id"], match["key"]
        if len(key) < MIN_KEY_CHARS:
            raise ValueError(f"{source}, entry {number}: the key of {key_id!r} is shorter than "
                             f"{MIN_KEY_CHARS} characters")
        digest = _digest(key.encode())
        if key_id in keys or any(digest == known.digest for known in keys.values()):
            raise ValueError(f"{source}, entry {number}: {key_id!r} repeats an id or a key")
        where = f"{source}, entry {number} ({key_id})"
        fields = match["fields"].split()  # the quota and priority class
        priorities = [f for f in fields if f.startswith(PRIORITY_FIELD)]
        if priorities[1:] or any(p[len(PRIORITY_FIELD):] not in PRIORITIES for p in priorities):
            raise ValueError(f"{where}: priority must be given once, as priority=online or "
                             "priority=bulk")
        bulk = bool(priorities) and priorities[0] == f"{PRIORITY_FIELD}bulk"
        quota = parse_quota([f for f in fields if f not in priorities], where)
        keys[key_id] = ApiKey(digest, quota, bulk)
    if not keys:
        raise ValueError(f"{source}: no keys (an empty source would lock every caller out)")
    return keys


def load_keys(auth: AuthConfig) -> dict[str, ApiKey]:
    """The configured keys; ValueError naming the setting when they are missing or bad."""
    if (path := auth.resolved_keys_file()) is not None:
        source = f"auth.api_keys_file ({path})"
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"{source}: cannot be read: {exc.strerror}") from None
        return parse_keys(text, source)
    source = f"auth.api_keys_env ({auth.api_keys_env})"
    if auth.api_keys_env not in os.environ:
        raise ValueError(f"{source}: the environment variable is not set")
    return parse_keys(os.environ[auth.api_keys_env], source, commas=True)


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def _file_version(path: Path | None) -> tuple | None:
    try:
        stat = path.stat() if path is not None else None
    except OSError:
        return ("missing",)
    return None if stat is None else (stat.st_mtime_ns, stat.st_size, stat.st_ino)


class KeyStore:
    """The keys of one ingress replica. A key file is re-read when it changes (looked at no
    more than once per RELOAD_CHECK_S), so removing a line revokes that key without a restart;
    a file that becomes unreadable or invalid is logged and locks everyone out until fixed."""

    def __init__(self, auth: AuthConfig) -> None:
        self._auth, self._path = auth, auth.resolved_keys_file()
        self._keys = load_keys(auth)
        self._version = _file_version(self._path)
        self._looked = time.monotonic()
        self.on_reload: Callable[[Iterable[str]], None] | None = None  # given the new ids

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def quota(self, key_id: str) -> Quota:
        known = self._keys.get(key_id)
        return NO_QUOTA if known is None else known.quota

    def bulk(self, key_id: str) -> bool:
        known = self._keys.get(key_id)
        return known is not None and known.bulk

    def key_id(self, authorization: bytes | None) -> str | None:
        """The id of the key in an `Authorization: Bearer <key>` header value, or None."""
        self._reload_if_changed()
        scheme, _, key = (authorization or b"").strip().partition(b" ")
        if scheme.lower() != b"bearer" or not key.strip():
            return None
        presented, found = _digest(key.strip()), None
        for key_id, known in self._keys.items():  # every key compared: no early exit
            if hmac.compare_digest(presented, known.digest):
                found = key_id
        return found

    def _reload_if_changed(self) -> None:
        if self._path is None or time.monotonic() - self._looked < RELOAD_CHECK_S:
            return
        self._looked = time.monotonic()
        version = _file_version(self._path)
        if version == self._version:
            return
        self._version = version
        try:
            self._keys = load_keys(self._auth)
        except ValueError as exc:  # fail closed: a revoked key must not outlive a bad edit
            self._keys = {}
            logger.error("API keys not reloaded, every request is refused until fixed: %s", exc)
            return
        # A warning, so that it reaches Serve's replica logs: who may call has changed.
        logger.warning("API keys reloaded from %s: ids %s", self._path, ", ".join(self.ids))
        if self.on_reload is not None:
            self.on_reload(self.ids)


class _Guard:
    """What the middleware of this process checks against: set by the ingress replica."""

    keys: KeyStore | None = None
    on_refused: Callable[[str], None] | None = None  # given the path of a refused request


_GUARD = _Guard()


def require_keys(keys: KeyStore | None, on_refused: Callable[[str], None]) -> None:
    """Make RequireApiKey check `keys` (None: auth off) in this process.

    NOTE: a process-wide setting, because serve.ingress runs a pickled copy of the FastAPI app
    that the replica's __init__ cannot reach; one ingress replica is one process."""
    _GUARD.keys, _GUARD.on_refused = keys, on_refused


class RequireApiKey:
    """ASGI middleware: every HTTP request but OPEN_PATHS needs a valid key; others get 401
    with `WWW-Authenticate: Bearer` in the error envelope before their body is read."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        keys = _GUARD.keys
        if scope["type"] != "http" or keys is None or scope["path"] in OPEN_PATHS:
            scope[KEY_ID_SCOPE] = NO_KEY
            return await self.app(scope, receive, send)
        authorization = dict(scope["headers"]).get(b"authorization")
        key_id = keys.key_id(authorization)
        if key_id is None:
            if _GUARD.on_refused is not None:
                _GUARD.on_refused(scope["path"])
            message = "invalid API key" if authorization else "missing API key"
            error = ApiError(401, f"{message}: send `Authorization: Bearer <key>`",
                             headers={"WWW-Authenticate": "Bearer"})
            response = JSONResponse(error.envelope(), status_code=401, headers=error.headers)
            return await response(scope, receive, send)
        scope[KEY_ID_SCOPE] = key_id
        await self.app(scope, receive, send)
