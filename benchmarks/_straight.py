"""The protocol's common path written straight, as context for the memory ledger's library CPU.

One function does what a protected call of the benchmark's tool does on the memory ledger
when nothing goes wrong, with the library's own pieces (the same context variables,
argument digest, owner token, clock, ledger methods, verdict, codec, lease and event check)
called one after the other: no plan, no protocol generator, no driver loop, no effect or
driving tuples. Anything off the common path (no ids, a nested call, a mismatch, a record
still running, a failure, a reserved result text) raises ``NotImplementedError``: this is
a measuring stick, never a way to call a tool.

Timed in the same rounds as ours, it separates what the decisions cost from what the
shape they are written in (decisions once, effects as data, two small drivers) costs.
It reaches into private modules on purpose; the smoke test runs it, so a change to them
that breaks it is seen at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from replaysafe import MemoryLedger
from replaysafe._clock import utcnow
from replaysafe._codec import JsonSerializer
from replaysafe._constants import LEASE_MARGIN, TOOL_TIMEOUT
from replaysafe._context import RunningCall, _current, _node, _scope
from replaysafe._core import _COMPLETED as COMPLETED
from replaysafe._core import _EXECUTED as EXECUTED
from replaysafe._core import _REPLAY as REPLAY
from replaysafe._core import _REPLAYED as REPLAYED
from replaysafe._core import ToolSpec, judge
from replaysafe._core import _unstorable as unstorable
from replaysafe._events import wanted
from replaysafe._identity import SignatureDigest
from replaysafe._owners import owner_alive, owner_token
from replaysafe._unrecorded import RESERVED_PREFIXES, is_reserved


def straight(ledger: MemoryLedger, body: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """``body(order_id)`` protected on ``ledger``, the common path only, written straight."""
    spec = ToolSpec(name, JsonSerializer(), (), "warn", None, 30.0, function=body)
    digests = SignatureDigest(["order_id"])
    monotonic = time.monotonic
    reach = timedelta(seconds=TOOL_TIMEOUT + LEASE_MARGIN)

    def call(*args: Any) -> Any:
        scope = _scope.get()
        if _current.get() is not None or scope is None or not all(scope.key) or _node.get() is not None:
            raise NotImplementedError("off the common path")
        key = scope.key
        digest = digests.of_positional(args)
        if digest is None:
            raise NotImplementedError("off the common path")
        lease = spec.lease_for(TOOL_TIMEOUT)
        owner = owner_token()
        now = utcnow()
        found = ledger.claim(
            key, tool_name=name, args_digest=digest, owner=owner, now=now, lease_expires_at=now + lease
        )
        record = found.record
        if record.key != key or record.tool_name != name or record.args_digest != digest:
            raise NotImplementedError("off the common path")
        if not found.claimed:
            text = record.result
            if judge(record, now, owner_alive) is not REPLAY or (
                text is not None and text.startswith(RESERVED_PREFIXES)
            ):
                raise NotImplementedError("off the common path")
            value = spec.decode(text)
            if wanted(REPLAYED):
                raise NotImplementedError("off the common path")
            return value
        # Under the default timeout the claim's lease already reaches the deadline: no lease to keep.
        if lease < reach:
            raise NotImplementedError("off the common path")
        token = _current.set(RunningCall.of(scope, name, 1, args, {}))
        started = monotonic()
        try:
            result = body(*args)
        finally:
            _current.reset(token)
        if monotonic() - started > TOOL_TIMEOUT:
            raise NotImplementedError("off the common path")
        encoded = spec.serializer.dumps(result)
        if unstorable(encoded) is not None or is_reserved(encoded) or len(encoded) > spec.max_result_bytes:
            raise NotImplementedError("off the common path")
        if not ledger.complete(key, owner=owner, status=COMPLETED, result=encoded, now=utcnow()):
            raise NotImplementedError("off the common path")
        if wanted(EXECUTED):
            raise NotImplementedError("off the common path")
        return result

    return call
