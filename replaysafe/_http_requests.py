"""The requests transport adapter of ``replaysafe.http``: a module of its own so that requests loads only on use."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from requests import PreparedRequest, Response
from requests.adapters import HTTPAdapter

from ._request_keys import HEADER, METHODS, _settings, _stamp


class IdempotencyKeyAdapter(HTTPAdapter):
    """A ``requests`` transport adapter that keys ``POST``/``PATCH`` requests made in a protected call.

    ``session.mount("https://", IdempotencyKeyAdapter())``; ``header=`` and ``methods=`` change
    what is keyed, and every other argument goes to ``HTTPAdapter`` (``max_retries=``, ...).
    """

    idempotency_header: str
    idempotency_methods: frozenset[str]

    def __init__(self, *args: Any, header: str = HEADER, methods: Iterable[str] = METHODS, **kwargs: Any) -> None:
        self.idempotency_header, self.idempotency_methods = _settings(header, methods)
        super().__init__(*args, **kwargs)

    def send(self, request: PreparedRequest, *args: Any, **kwargs: Any) -> Response:
        # A redirect is sent through here again with the header already set: it keeps its key.
        _stamp(request.method or "", request.headers, self.idempotency_header, self.idempotency_methods)
        return super().send(request, *args, **kwargs)
