"""``replaysafe demo --in-doubt``: a crash while the refund is in flight, under each in-doubt policy.

``refund_order`` sends a refund to a payment provider (``provider``: a local HTTP
service that dedupes by ``Idempotency-Key``, served from a thread of this process)
with ``current_call().idempotency_key``. The agent process is SIGKILLed right after
the provider's answer arrives: the money moved, but the tool never returned, so
the ledger holds no result and the call is *in doubt*. A new process resumes the
run, and the in-doubt policy decides what happens. A last story shows the same
crash with a new key on every attempt: the provider cannot dedupe it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path
from typing import Any

from .._context import CallInfo, InDoubt, current_call, tool_call
from .._core import RERUN
from .._decorator import replay_safe
from .._errors import CallInDoubtError
from .._events import Event, EventKind, on_event
from .._records import CallKey
from ..ledgers.sqlite import SqliteLedger
from .provider import FakePaymentProvider, Refund, create_refund, find_refund, list_refunds

KEY = CallKey("support-thread-42", "msg_7", "call_1")
ORDER_ID = "1042"
AMOUNT = 59.0
#: An owner token (``host:pid:start#n``), its pid captured.
_OWNER_TOKEN = re.compile(r"\S+:(\d+):\d+#\d+")
#: The resumed agent's exit code when the call raised ``CallInDoubtError``.
IN_DOUBT_EXIT = 3


def _say(text: str) -> None:
    print(text, flush=True)


def _money(amount: float) -> str:
    return f"${amount:.2f}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _result(refund: Refund) -> dict[str, Any]:
    """What ``refund_order`` returns, and what a reconciler or an operator records for it."""
    return {"refund_id": refund["id"], "order_id": refund["order_id"], "amount": refund["amount"]}


# --- the agent process --------------------------------------------------------------


def agent_process(workdir: Path, provider_url: str, policy: str, keys: str, crash: bool) -> int:
    """One agent process: call ``refund_order`` once under fixed ids; SIGKILL itself mid-call if ``crash``."""
    ledger = SqliteLedger(workdir / "ledger.db")
    ran: list[int] = []

    def check_refund(call: CallInfo) -> Any:
        """The reconciler: ask the provider whether it already made a refund under this call's key."""
        _say(f"  check_refund: GET /refunds?idempotency_key={call.idempotency_key}")
        refund = find_refund(provider_url, call.idempotency_key)
        if refund is None:
            _say("  check_refund: the provider has no such refund -> RERUN")
            return RERUN
        _say(f"  check_refund: the provider has refund {refund['id']} ({_money(refund['amount'])}) -> return it")
        return _result(refund)

    policies: dict[str, InDoubt] = {"rerun": "rerun", "raise": "raise", "reconciler": check_refund}

    @replay_safe(ledger=ledger, in_doubt=policies[policy])
    def refund_order(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order through the payment provider."""
        call = current_call()
        if call is None:
            raise RuntimeError("refund_order must run as a protected call")
        ran.append(call.attempt)
        key = call.idempotency_key if keys == "stable" else uuid.uuid4().hex
        _say(f"  attempt {call.attempt}: POST /refunds  Idempotency-Key: {key}")
        refund = create_refund(provider_url, order_id, amount, idempotency_key=key)
        if refund["replayed"]:
            _say(f"  provider: key seen before -> returns refund {refund['id']} again, no money moved")
        else:
            _say(f"  provider: refund {refund['id']} created, {_money(refund['amount'])} moved")
        if crash:
            _say(
                f"  ** process {os.getpid()} is killed (SIGKILL) with the refund done and refund_order not returned **"
            )
            os.kill(os.getpid(), signal.SIGKILL)
        return _result(refund)

    def narrate(event: Event) -> None:
        if event.kind is EventKind.IN_DOUBT:
            then = {
                "rerun": f"run it again as attempt {(event.attempt or 0) + 1}",
                "raise": "raise CallInDoubtError, run nothing",
                "reconciler": "ask the reconciler check_refund",
            }[policy]
            _say(f"  replaysafe: in doubt (attempt {event.attempt}'s process died mid-call) -> {then}")
        elif event.kind is EventKind.RECONCILED:
            _say("  replaysafe: the reconciler's answer is recorded as the call's result")

    on_event(narrate)
    _say(f"process {os.getpid()} runs refund_order(order_id={ORDER_ID!r}, amount={AMOUNT!r})")
    try:
        with tool_call(*KEY):
            result = refund_order(ORDER_ID, AMOUNT)
    except CallInDoubtError as exc:
        _say(textwrap.fill(f"CallInDoubtError: {exc}", width=110, initial_indent="  ", subsequent_indent="    "))
        # The owner is kept out of the message (a framework may show it to the model); an operator reads it
        # from the error. Its token (host:pid:start#n) is internal: the pid is what the story shows.
        owner = _OWNER_TOKEN.fullmatch(exc.owner or "")
        _say(f"  the error's owner: process {owner[1] if owner else exc.owner}, the one that died")
        return IN_DOUBT_EXIT
    finally:
        ledger.close()
    how = f"refund_order ran (attempt {ran[0]})" if ran else "refund_order did not run"
    _say(f"  refund_order -> {result!r}   [{how}]")
    return 0


# --- the stories ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Story:
    title: str
    policy: str
    keys: str
    #: ``(refund requests, refunds)`` the provider should see when the story ends.
    expected: tuple[int, int]


STORIES = (
    Story('in_doubt="rerun" (the default), key: current_call().idempotency_key', "rerun", "stable", (2, 1)),
    Story('in_doubt="raise", key: current_call().idempotency_key', "raise", "stable", (1, 1)),
    Story("in_doubt=check_refund (a reconciler), key: current_call().idempotency_key", "reconciler", "stable", (1, 1)),
    Story(
        'contrast: in_doubt="rerun", key: uuid4() made inside the tool (new on every attempt)',
        "rerun",
        "random",
        (2, 2),
    ),
)


def _agent(workdir: Path, provider: FakePaymentProvider, story: Story, *, crash: bool, expect: int) -> bool:
    """Run one agent process; show its output; say whether it ended as expected."""
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "replaysafe._demo.in_doubt",
            "agent",
            str(workdir),
            provider.url,
            *_options(story, crash),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    sys.stdout.write(child.stdout)
    if child.returncode == expect:
        return True
    _say(f"!! the agent process exited with {child.returncode}, expected {expect}:")
    sys.stdout.write(textwrap.indent(child.stderr, "   "))
    return False


def _options(story: Story, crash: bool) -> list[str]:
    return [story.policy, story.keys, "crash" if crash else "resume"]


def _operator_settles(workdir: Path, provider: FakePaymentProvider) -> bool:
    """What an operator does with a CallInDoubtError: look the refund up, then record it."""
    _say(f"the operator looks order {ORDER_ID} up at the provider: GET /refunds?order_id={ORDER_ID}")
    refunds = list_refunds(provider.url, ORDER_ID)
    for refund in refunds:
        _say(f"  {refund['id']}: {_money(refund['amount'])} for order {refund['order_id']}")
    if len(refunds) != 1:
        _say(f"!! expected exactly one refund, found {len(refunds)}")
        return False
    result = _result(refunds[0])
    with SqliteLedger(workdir / "ledger.db") as ledger:
        ledger.resolve(KEY, result=result)
    _say(f"the operator settles the call: ledger.resolve(CallKey{tuple(KEY)!r},\n    result={result!r})")
    return True


def _story(number: int, story: Story) -> tuple[int, bool]:
    """Tell one story; return the number of refunds and whether everything came out as expected."""
    _say(f"\n=== {number}. {story.title} ===")
    with (
        tempfile.TemporaryDirectory(prefix="replaysafe-demo-") as tmp,
        FakePaymentProvider(Path(tmp) / "provider.json") as provider,
    ):
        workdir = Path(tmp)
        ok = _agent(workdir, provider, story, crash=True, expect=-signal.SIGKILL)
        _say("the run resumes in a new process:")
        if story.policy == "raise":
            ok = _agent(workdir, provider, story, crash=False, expect=IN_DOUBT_EXIT) and ok
            ok = _operator_settles(workdir, provider) and ok
            _say("the run resumes in a new process:")
        ok = _agent(workdir, provider, story, crash=False, expect=0) and ok
        requests, refunds = provider.store.refund_requests(), len(provider.store.refunds())
        moved = provider.store.money_moved()
    _say(f"provider: {_count(requests, 'refund request')}, {_count(refunds, 'refund')}, {_money(moved)} moved")
    if refunds == 1:
        _say("result: the customer was refunded once. Correct.")
    else:
        _say(f"result: the customer was refunded {refunds} times: {_money(moved)} for a {_money(AMOUNT)} refund.")
    if (requests, refunds) != story.expected:
        _say(f"!! expected {_count(story.expected[0], 'refund request')} and {_count(story.expected[1], 'refund')}")
        ok = False
    return refunds, ok


def main() -> int:
    """Tell every story; return 0 when each came out as it should."""
    _say(
        "replaysafe demo --in-doubt: refund_order sends a refund to a payment provider (a local HTTP service that\n"
        "dedupes by Idempotency-Key). The agent process is killed after the provider accepted the refund and before\n"
        "refund_order returned, so the ledger has no result: the call is in doubt. Then the run resumes.\n"
        f"Every story is the same tool call: thread {KEY.thread_id!r}, message {KEY.message_id!r}, "
        f"tool call {KEY.tool_call_id!r}."
    )
    counts: list[int] = []
    all_ok = True
    for number, story in enumerate(STORIES, start=1):
        refunds, ok = _story(number, story)
        counts.append(refunds)
        all_ok = all_ok and ok
    rerun, raised, reconciled, fresh_keys = counts
    _say(
        f"\nsummary: refunds with a stable key: rerun {rerun}, raise {raised}, reconciler {reconciled}; "
        f"with a new key per attempt: {fresh_keys}.\nThe ledger cannot know whether an in-doubt refund went through; "
        "the provider can, when every attempt sends it the same key."
    )
    return 0 if all_ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["agent"]:
        workdir, url, policy, keys, mode = sys.argv[2:7]
        sys.exit(agent_process(Path(workdir), url, policy, keys, mode == "crash"))
    sys.exit(main())
