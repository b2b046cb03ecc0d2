"""The protocol's common path written straight, as context for the memory ledger's library CPU.

One function does what a protected call of the benchmark's tool does on the memory ledger
when nothing goes wrong, with the library's own pieces called one after the other: the
plan's checks (the test switch, the ledger, the call's own scope and pauses, the timeout
worked out from every setting), the argument digest, owner token, clock, ledger methods,
verdict, codec, lease, storable and reserved-text checks and event checks. No plan tuple,
no protocol generator, no driver loop, no effect or driving tuples. Anything off the common
path (no ids, a nested call, a timeout set anywhere, a node, a sealing ledger, metrics
observers, a mismatch, a record still running, a failure, a reserved result text) raises
``NotImplementedError``: this is a measuring stick, never a way to call a tool.

Timed in the same rounds as ours, it separates what the decisions cost from what the
shape they are written in (decisions once, effects as data, two small drivers) costs.
It reaches into private modules on purpose; the smoke test runs it, so a change to them
that breaks it is seen at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from replaysafe import Ledger, MemoryLedger, _config, _metrics
from replaysafe._clock import utcnow
from replaysafe._codec import JsonSerializer
from replaysafe._config import default_ledger
from replaysafe._constants import LEASE_MARGIN, TOOL_TIMEOUT
from replaysafe._context import UNSET, CallScope, RunningCall, _current, _node, _scope
from replaysafe._core import _COMPLETED as COMPLETED
from replaysafe._core import _EXECUTED as EXECUTED
from replaysafe._core import _REPLAY as REPLAY
from replaysafe._core import _REPLAYED as REPLAYED
from replaysafe._core import ToolSpec, judge, lease_length, seconds
from replaysafe._core import _unstorable as unstorable
from replaysafe._events import wanted
from replaysafe._identity import SignatureDigest
from replaysafe._owners import owner_alive, owner_token
from replaysafe._records import new_tuple
from replaysafe._unrecorded import RESERVED_PREFIXES, is_reserved


def straight(ledger: MemoryLedger, body: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """``body(order_id)`` protected on ``ledger``, the common path only, written straight."""
    spec = ToolSpec(name, JsonSerializer(), (), "warn", None, 30.0, function=body)
    digests = SignatureDigest(["order_id"])
    monotonic = time.monotonic
    tool_ledger: Ledger = ledger
    tool_timeout_setting: Any = UNSET  # the decorator's timeout: not given
    pause_on: tuple[type[BaseException], ...] = ()

    def call(*args: Any) -> Any:
        # What the plan decides: protected at all, which ledger, key and scope, which timeout.
        if _config.disabled or _current.get() is not None:
            raise NotImplementedError("off the common path")
        scope = _scope.get()
        chosen = tool_ledger or (scope.ledger if scope is not None else None) or default_ledger()
        if scope is None or not all(scope.key):
            raise NotImplementedError("off the common path")
        key = scope.key
        digest = digests.of_positional(args)
        if digest is None:
            raise NotImplementedError("off the common path")
        pauses = pause_on + _config.pauses
        # The call's own scope, as a step of it would see it: its ledger and pauses.
        fields = (key, chosen, scope.pauses + pauses, scope.tool_timeout, scope.in_doubt, None, None)
        scope = new_tuple(CallScope, fields)
        timeout = scope.tool_timeout
        if timeout is UNSET:
            timeout = tool_timeout_setting
        if timeout is UNSET:
            timeout = _config.default_tool_timeout
        if timeout is not UNSET or _node.get() is not None:
            raise NotImplementedError("off the common path")  # a hard deadline, or a node's
        timeout = TOOL_TIMEOUT
        if getattr(chosen, "sealer", None) is not None or _metrics.observers is not None:
            raise NotImplementedError("off the common path")
        # The claim, and what it found.
        lease = lease_length(spec.lease, timeout)
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
        if lease < seconds(timeout + LEASE_MARGIN):
            raise NotImplementedError("off the common path")
        token = _current.set(RunningCall.of(scope, name, 1, args, {}))
        started = monotonic()
        try:
            result = body(*args)
        finally:
            _current.reset(token)
        if monotonic() - started > timeout:
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
