"""`answer-service keys add | list | revoke`: the API key file (answer_service/runtime/keys/auth.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from answer_service.runtime.keys.auth import (
    ApiKey,
    ApiKeyFileError,
    check_tier,
    digest,
    new_key,
    parse_collections,
    read_api_keys,
    write_api_keys,
)


def _read(path: Path) -> list[ApiKey]:
    return read_api_keys(path) if path.exists() else []


def _served_tiers() -> list[str]:
    """The tiers the service serves, as it would read them (`ANSWER_TIER_WEIGHTS`)."""
    from answer_service.runtime.settings import Settings

    try:
        return list(Settings().tier_weights)
    except ValidationError as exc:
        raise ApiKeyFileError(f"cannot read the service's settings: {exc}") from exc


def _add(args: argparse.Namespace) -> int:
    keys = _read(args.file)
    if any(k.key_id == args.id for k in keys):
        print(f"error: {args.file} already has a key {args.id!r}", file=sys.stderr)
        return 2
    key = new_key()
    entry = ApiKey(
        args.id,
        digest(key),
        args.tier,
        args.rate_per_s,
        args.burst,
        args.max_streams,
        admin=args.admin,
        collections=None if args.all_collections else parse_collections(args.collections),
        write=parse_collections(args.write, "--write") if args.write else frozenset(),
    )
    check_tier(entry, _served_tiers())
    keys.append(entry)
    write_api_keys(args.file, keys)
    print(key)  # the only time it is shown: the file keeps its digest
    return 0


def _list(args: argparse.Namespace) -> int:
    for key in _read(args.file):
        readable = "*" if key.collections is None else ",".join(sorted(key.collections))
        print(
            f"{key.key_id}\ttier={key.tier}\trate={key.rate_per_s:g}/s\tburst={key.burst}"
            f"\tmax_streams={key.max_streams}\tcollections={readable}"
            f"\twrite={','.join(sorted(key.write)) or '-'}" + ("\tadmin" if key.admin else "")
        )
    return 0


def _revoke(args: argparse.Namespace) -> int:
    keys = _read(args.file)
    kept = [k for k in keys if k.key_id != args.id]
    if len(kept) == len(keys):
        print(f"error: no key {args.id!r} in {args.file}", file=sys.stderr)
        return 2
    write_api_keys(args.file, kept)
    return 0


def _guarded(run: Any) -> Any:
    def call(args: argparse.Namespace) -> int:
        try:
            code: int = run(args)
        except ApiKeyFileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return code

    return call


def add_keys_commands(commands: Any) -> None:
    keys = commands.add_parser("keys", help="API keys: add, list, revoke").add_subparsers(
        dest="keys_command", required=True
    )
    add = keys.add_parser("add", help="make a key, print it once, store its digest")
    add.add_argument("--file", type=Path, required=True, help="the ANSWER_API_KEYS_FILE")
    add.add_argument("--id", required=True, help="a name for the key (shown in errors, logs)")
    add.add_argument("--tier", default="standard", help="its tenant tier")
    add.add_argument("--rate-per-s", type=float, default=5.0)
    add.add_argument("--burst", type=int, default=10)
    add.add_argument("--max-streams", type=int, default=4, help="open answers at once")
    add.add_argument(
        "--admin", action="store_true", help="sees every key's traces (GET /v1/traces)"
    )
    readable = add.add_mutually_exclusive_group(required=True)
    readable.add_argument(
        "--collections",
        metavar="A,B",
        help="the only collections it may read (retrieve, quote, cite, fetch)",
    )
    readable.add_argument(
        "--all-collections", action="store_true", help="it may read every collection"
    )
    add.add_argument(
        "--write",
        metavar="A,B",
        help="collections it may put documents into and delete them from "
        "(PUT/DELETE /v1/collections/{c}/documents/{id}); none by default",
    )
    add.set_defaults(run=_guarded(_add))
    listing = keys.add_parser("list", help="the keys' ids, tiers and limits (no secrets)")
    listing.add_argument("--file", type=Path, required=True)
    listing.set_defaults(run=_guarded(_list))
    revoke = keys.add_parser("revoke", help="remove a key")
    revoke.add_argument("--file", type=Path, required=True)
    revoke.add_argument("--id", required=True)
    revoke.set_defaults(run=_guarded(_revoke))
