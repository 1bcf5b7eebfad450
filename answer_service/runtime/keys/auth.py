"""API keys: who may ask, at which tenant tier, how fast and how many at once.

Keys live in a JSON file (`ANSWER_API_KEYS_FILE`) as SHA-256 digests, never in clear:
`answer-service keys add` makes a random key, prints it once and stores its digest. A presented
key is hashed and compared with every stored digest in constant time (`hmac.compare_digest`,
no early exit), so timing says nothing about which digest came close. Keys are random 256-bit
tokens, so an unsalted fast hash is enough (as for GitHub or Stripe tokens); passwords would
need a slow one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

KEY_PREFIX = "ask_"


@dataclass(frozen=True, slots=True)
class ApiKey:
    key_id: str
    sha256: str
    tier: str
    # Token bucket: sustained requests per second and the burst above it.
    rate_per_s: float = 5.0
    burst: int = 10
    # Answers this key may have open at once (streams or not), per replica.
    max_streams: int = 4
    # Sees every tenant's traces (`GET /v1/traces`), not only its own (a key limited to some
    # collections sees only its own, admin or not: others' traces may name their passages).
    admin: bool = False
    # The collections it may read; None: every collection (`--all-collections`, and every key
    # written before collections existed, whose entry has no `collections`).
    collections: frozenset[str] | None = None
    # The collections whose documents it may put and delete over HTTP (`--write`); none by
    # default.
    write: frozenset[str] = frozenset()

    def may_read(self, collection: str) -> bool:
        return self.collections is None or collection in self.collections

    def may_write(self, collection: str) -> bool:
        return collection in self.write


class ApiKeyFileError(ValueError):
    pass


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def check_tier(key: ApiKey, tiers: Collection[str]) -> None:
    """A key must be of a tier the service serves (`ANSWER_TIER_WEIGHTS`): the generation
    slots queue by tier and have no queue for another."""
    if key.tier not in tiers:
        raise ApiKeyFileError(
            f"key {key.key_id!r}: tier {key.tier!r} is not one of {sorted(tiers)} "
            "(ANSWER_TIER_WEIGHTS)"
        )


def read_api_keys(path: Path, tiers: Collection[str] | None = None) -> list[ApiKey]:
    """`{"keys": [{"id", "sha256", "tier", "rate_per_s"?, "burst"?, "max_streams"?,
    "admin"?, "collections"?, "write"?}, ...]}` (`collections`: a list of names, or null or
    absent for every collection; `write`: the collections it may put documents into);
    a malformed file, or (given the served `tiers`) a key of another tier, is refused with
    the reason."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ApiKeyFileError(f"{path}: cannot read the API keys: {exc}") from exc
    entries = raw.get("keys") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise ApiKeyFileError(f'{path}: expected {{"keys": [...]}}')
    keys: list[ApiKey] = []
    for n, entry in enumerate(entries):
        try:
            key = ApiKey(
                key_id=str(entry["id"]),
                sha256=str(entry["sha256"]).lower(),
                tier=str(entry["tier"]),
                rate_per_s=float(entry.get("rate_per_s", 5.0)),
                burst=int(entry.get("burst", 10)),
                max_streams=int(entry.get("max_streams", 4)),
                admin=entry.get("admin", False),
                collections=_collections(entry.get("collections")),
                write=_collections(entry.get("write", [])) or frozenset(),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ApiKeyFileError(f"{path}: key {n}: {exc!r}") from exc
        if len(key.sha256) != 64 or any(c not in "0123456789abcdef" for c in key.sha256):
            raise ApiKeyFileError(f"{path}: key {key.key_id!r}: sha256 must be 64 hex digits")
        if not isinstance(key.admin, bool):
            raise ApiKeyFileError(f"{path}: key {key.key_id!r}: admin must be true or false")
        if key.rate_per_s <= 0 or key.burst < 1 or key.max_streams < 1:
            raise ApiKeyFileError(f"{path}: key {key.key_id!r}: limits must be positive")
        if tiers is not None:
            try:
                check_tier(key, tiers)
            except ApiKeyFileError as exc:
                raise ApiKeyFileError(f"{path}: {exc}") from None
        keys.append(key)
    ids = [k.key_id for k in keys]
    if len(set(ids)) != len(ids):
        raise ApiKeyFileError(f"{path}: key ids must be distinct")
    return keys


def _collections(raw: object) -> frozenset[str] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(c, str) and c for c in raw):
        raise ValueError("collections must be a list of names, or null for every collection")
    return frozenset(raw)


def parse_collections(text: str, option: str = "--collections") -> frozenset[str]:
    """`a,b` (as `keys add --collections` and `--write` take them) as names; none is
    refused."""
    names = frozenset(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise ApiKeyFileError(f"{option} needs at least one collection name")
    return names


def write_api_keys(path: Path, keys: Iterable[ApiKey]) -> None:
    entries = []
    for key in keys:
        entry = asdict(key)
        entry["id"] = entry.pop("key_id")
        collections = entry.pop("collections")
        entry["collections"] = None if collections is None else sorted(collections)
        entry["write"] = sorted(entry.pop("write"))
        entries.append(entry)
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps({"keys": entries}, indent=2) + "\n")
    partial.chmod(0o600)
    partial.replace(path)


class KeyRing:
    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self._keys = [(bytes.fromhex(k.sha256), k) for k in keys]

    def replace(self, keys: Iterable[ApiKey]) -> None:
        """Hold `keys` from now on (the file changed); a lookup under way finishes on the
        old list."""
        self._keys = [(bytes.fromhex(k.sha256), k) for k in keys]

    def __len__(self) -> int:
        return len(self._keys)

    def find(self, presented: str) -> ApiKey | None:
        wanted = hashlib.sha256(presented.encode()).digest()
        found: ApiKey | None = None
        for stored, key in self._keys:  # every digest, whatever matched
            if hmac.compare_digest(stored, wanted):
                found = key
        return found


class StreamCounts:
    """Open answers per key on this replica."""

    def __init__(self) -> None:
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def try_open(self, key: ApiKey) -> bool:
        with self._lock:
            now = self._open.get(key.key_id, 0)
            if now >= key.max_streams:
                return False
            self._open[key.key_id] = now + 1
            return True

    def close(self, key: ApiKey) -> None:
        with self._lock:
            left = self._open.get(key.key_id, 0) - 1
            if left > 0:
                self._open[key.key_id] = left
            else:
                self._open.pop(key.key_id, None)

    def open_count(self, key: ApiKey) -> int:
        with self._lock:
            return self._open.get(key.key_id, 0)
