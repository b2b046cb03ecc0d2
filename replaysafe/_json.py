"""Fast JSON for the hot path (argument digests and results): an encoder factory and a plain-data test."""

from __future__ import annotations

import json
import json.encoder
import json.scanner
import sys
from collections.abc import Callable
from typing import Any


def json_encoder(
    *, default: Callable[[Any], Any], sort_keys: bool, ensure_ascii: bool, separators: tuple[str, str]
) -> Callable[[Any], str]:
    """``json.JSONEncoder(...).encode``, calling the C encoder directly where it can.

    ``JSONEncoder.encode`` builds a new C encoder on every call, which costs about as
    much as the encoding of a small dict; this builds it once. Circular data ends in
    a ``RecursionError`` instead of a ``ValueError`` (both are caught by the callers).
    """
    item_separator, key_separator = separators
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None or sys.version_info < (3, 11):  # pragma: no cover - other signature before 3.11
        return json.JSONEncoder(
            default=default, sort_keys=sort_keys, ensure_ascii=ensure_ascii, separators=separators, allow_nan=True
        ).encode
    strings = json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
    encode = make(None, default, strings, None, key_separator, item_separator, sort_keys, False, True)

    def encoded(value: Any) -> str:
        return "".join(encode(value, 0))

    return encoded


def json_decoder(*, object_hook: Callable[[dict[str, Any]], Any] | None = None) -> Callable[[str], Any]:
    """``json.loads`` of text, calling the decoder's scanner directly where it can.

    ``json.loads`` goes through three Python frames and two regular-expression matches
    (for surrounding whitespace) before and after its C scanner, which costs about three
    times the scanning of a small document. Text the scanner reads from its first
    character to its last (all that ``JSONSerializer`` writes) is decoded by the scanner
    alone; anything else (surrounding whitespace, a BOM, extra or no data) goes to
    ``json.loads`` itself, which returns the same value or raises its own error.
    """
    scan = json.scanner.make_scanner(json.JSONDecoder(object_hook=object_hook))  # type: ignore[arg-type]

    def decoded(text: str) -> Any:
        try:
            value, end = scan(text, 0)
        except StopIteration:
            end = -1
        if end == len(text):
            return value
        return json.loads(text, object_hook=object_hook)

    return decoded


#: The key that marks the result codec's tagged objects.
TAG_KEY = "__replaysafe__"
JSON_SCALARS: frozenset[type] = frozenset({str, int, float, bool, type(None)})


def is_plain(value: Any, _scalars: frozenset[type] = JSON_SCALARS, _tag: str = TAG_KEY) -> bool:
    """Whether ``value`` is JSON data of exact types, which json writes and reads back unchanged.

    Dicts with ``str`` keys (none of them ``TAG_KEY``), lists, ``str``, ``int``, ``float``,
    ``bool`` and ``None``; not their subclasses (an ``IntEnum`` is written as a bare
    ``int``), nor tuples (written as lists). The fast paths' test: it costs less than
    the encoding (the defaults bind constants as locals, the cheapest lookup here).

    It calls itself with every argument given: Python 3.13.0 skips the recursion limit on
    a call that fills in defaults, so circular data would recurse until memory runs out.
    """
    kind = type(value)
    if kind in _scalars:
        return True
    if kind is dict:
        if _tag in value:
            return False
        for key, item in value.items():
            if type(key) is not str or (type(item) not in _scalars and not is_plain(item, _scalars, _tag)):
                return False
        return True
    if kind is list:
        for item in value:  # noqa: SIM110 - a loop is faster than all() over a generator
            if type(item) not in _scalars and not is_plain(item, _scalars, _tag):
                return False
        return True
    return False
