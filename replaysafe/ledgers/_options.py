"""Ledger options in a URL's query string, and the default I/O timeouts of server ledgers.

Every backend reads its own options from its URL, so ``open_ledger(url)`` and
``PostgresLedger(url)`` agree. An option neither the ledger nor its driver knows
is an error at construction: a typo must not silently drop a setting.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Collection, Mapping
from typing import Any

from .._constants import LEDGER_CONNECT_TIMEOUT, LEDGER_IO_TIMEOUT


def split_url_options(
    url: str, ours: Mapping[str, Callable[[str], Any]], theirs: Collection[str], what: str
) -> tuple[str, dict[str, Any]]:
    """``url`` without the ledger's own query options, and those options, converted.

    ``theirs`` are the options the driver takes (they stay in the URL). Values are
    never quoted back in messages: a query string may hold a password.
    """
    base, sep, query_text = url.partition("?")
    if not sep:
        return url, {}
    options: dict[str, Any] = {}
    kept: list[tuple[str, str]] = []
    for name, value in urllib.parse.parse_qsl(query_text, keep_blank_values=True):
        if name in ours:
            try:
                options[name] = ours[name](value)
            except ValueError:
                raise ValueError(f"{what}: the URL option {name!r} has a value of the wrong type") from None
        elif name in theirs:
            kept.append((name, value))
        else:
            known = ", ".join(sorted(ours))
            raise ValueError(
                f"{what}: unknown URL option {name!r}. The ledger takes {known}; other options must be ones "
                "its driver knows. Fix or remove it."
            )
    # Rebuilt by hand: urlunsplit would turn sqlite:////abs/path into sqlite://abs/path.
    return (f"{base}?{urllib.parse.urlencode(kept)}" if kept else base), options


def given_first(from_url: Mapping[str, Any], **given: Any) -> tuple[Any, ...]:
    """Each argument, or the URL option of its name where the argument is ``None``: an argument wins over the URL."""
    return tuple(from_url.get(name) if value is None else value for name, value in given.items())


def timeout(value: float | None, option: str, default: float) -> float:
    """A positive number of seconds; ``None`` gives the default."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{option} must be a positive number of seconds, got {value!r}")
    return float(value)


def io_timeouts(connect_timeout: float | None, io_timeout: float | None) -> tuple[float, float]:
    """The connect and I/O timeouts of a server ledger, defaults filled in."""
    return (
        timeout(connect_timeout, "connect_timeout", LEDGER_CONNECT_TIMEOUT),
        timeout(io_timeout, "io_timeout", LEDGER_IO_TIMEOUT),
    )


def redact(url: str) -> str:
    """The URL with every password in it shown as ``***``, for messages and printed commands: its userinfo's
    (found by the last ``@``, so a ``#``, ``?`` or ``/`` in the password does not hide it), a ``password=`` query
    option's, and those of a URL nested in a ``cache=`` option (percent-encoded, as documented, or not)."""
    head, sep, rest = url.partition("://")
    if sep and "@" in rest:
        credentials, _, host = rest.rpartition("@")
        user, colon, _ = credentials.partition(":")
        rest = f"{user}:***@{host}" if colon else rest
    where, mark, query = rest.partition("?")
    if not mark:
        return f"{head}{sep}{rest}"
    parts = []
    for part in query.split("&"):
        name, eq, value = part.partition("=")
        option = urllib.parse.unquote_plus(name).lower()
        if eq and option in _SECRET_OPTIONS:
            part = f"{name}=***"
        elif eq and option == "cache":
            nested = urllib.parse.unquote_plus(value)
            if redact(nested) != nested:
                part = f"{name}={urllib.parse.quote(redact(nested), safe='*')}"
        parts.append(part)
    return f"{head}{sep}{where}{mark}{'&'.join(parts)}"


#: Query options whose value is a secret (redis-py and libpq read a password from ``password=``).
_SECRET_OPTIONS = frozenset({"password"})
