"""One fast JSON encoder factory for the hot path (argument digests and results)."""

from __future__ import annotations

import json
import json.encoder
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
