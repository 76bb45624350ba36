"""Store URLs: what ``--idempotency-store`` names (``memory://``, ``sqlite:///PATH.db``,
``dynamodb://TABLE``, ``postgresql://HOST/DB``), checked without touching the store,
and shown without their password."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from ..errors import ConfigError

SCHEMES = ("memory", "sqlite", "dynamodb", "postgresql", "postgres")


@dataclass(frozen=True)
class StoreURL:
    url: str
    scheme: str
    location: str  # the database path or the table name
    options: dict[str, str]


OPTIONS: dict[str, set[str]] = {
    "memory": set(),
    "sqlite": {"timeout", "synchronous"},
    "dynamodb": {"region", "endpoint"},
}
# Besides these, a PostgreSQL URL's parameters are libpq's (sslmode, ...): libpq checks them.
POSTGRES_OPTIONS = {"table", "pool"}
POSTGRES_TABLE = "sqsworker_idempotency"
POSTGRES_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")  # unquoted in SQL as written


def parse_url(url: str) -> StoreURL:
    """Check a store URL's shape without touching the store."""
    parts = urlsplit(url.strip())
    hint = "use memory://, sqlite:///PATH.db, dynamodb://TABLE or postgresql://HOST/DB"
    if parts.scheme not in SCHEMES or "://" not in url:
        raise ConfigError(f"{shown(url)!r} is not an idempotency store URL: {hint}", field="store")
    query = parse_qs(parts.query, keep_blank_values=True)
    options = {k: v[-1] for k, v in query.items()}
    if parts.scheme in ("postgresql", "postgres"):
        ours = {k: v for k, v in options.items() if k in POSTGRES_OPTIONS}
        table = ours.get("table", POSTGRES_TABLE)
        names = table.split(".")
        if len(names) > 2 or not all(POSTGRES_NAME.fullmatch(n) for n in names):
            raise ConfigError(
                f"{shown(url)}: table={table!r} is not a table name; use lowercase letters, "
                "digits and '_' (up to 63, not starting with a digit), as NAME or SCHEMA.NAME",
                field="store",
            )
        if "pool" in ours and not (ours["pool"].isdigit() and int(ours["pool"]) >= 2):
            raise ConfigError(
                f"{shown(url)}: pool must be a number of connections, 2 or more",
                field="store",
            )
        return StoreURL(url.strip(), "postgresql", parts.netloc + parts.path, ours)
    unknown = sorted(set(options) - OPTIONS[parts.scheme])
    if unknown:
        allowed = ", ".join(sorted(OPTIONS[parts.scheme])) or "none"
        raise ConfigError(
            f"{url!r} has unknown option(s) {', '.join(unknown)}; "
            f"{parts.scheme} stores take: {allowed}",
            field="store",
        )
    if parts.scheme == "memory":
        return StoreURL(url, "memory", parts.netloc + parts.path, options)
    if parts.scheme == "sqlite":
        if parts.netloc:
            raise ConfigError(
                f"{url!r} names a host; write sqlite:///relative/path.db or "
                "sqlite:////absolute/path.db (three or four slashes)",
                field="store",
            )
        path = parts.path[1:]
        if not path or path == ":memory:":
            raise ConfigError(
                f"{url!r} names no database file: write sqlite:///PATH.db "
                "(an in-memory database cannot be shared by the worker's threads; "
                "use memory:// for tests)",
                field="store",
            )
        return StoreURL(url, "sqlite", path, options)
    table = parts.netloc
    if parts.path not in ("", "/") or not _valid_table(table):
        raise ConfigError(
            f"{url!r} does not name a DynamoDB table: write dynamodb://TABLE, where TABLE "
            "has 3 to 255 letters, digits, '_', '-' or '.'",
            field="store",
        )
    return StoreURL(url, "dynamodb", table, options)


def shown(url: str) -> str:
    """A URL without its password, for messages. It fails closed: when the part before
    the last '@' does not read as USER or USER:PASSWORD, all of it is masked."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    at = rest.rfind("@")
    if at >= 0:
        userinfo = rest[:at]
        if any(c in userinfo for c in "/?#"):  # not USER[:PASSWORD]: hide all of it
            userinfo = "***"
        elif ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        rest = userinfo + rest[at:]
    rest = re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", rest)
    return f"{scheme}{sep}{rest}"


def scrubbed(text: str, url: str) -> str:
    """``text`` (a driver's message) without the password of ``url``, raw or decoded."""
    secrets = set(re.findall(r"(?i)[?&]password=([^&#]*)", url))
    rest = url.partition("://")[2]
    if "@" in rest:
        userinfo = rest[: rest.rfind("@")]
        if ":" in userinfo:
            secrets.add(userinfo.split(":", 1)[1])
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***").replace(unquote(secret), "***")
    return text


def _valid_table(name: str) -> bool:
    return 3 <= len(name) <= 255 and all(c.isalnum() or c in "_-." for c in name)
