"""Small agents for ``replaysafe crashtest`` to test (tests/test_crashtest.py), each an entry point.

Each keeps its conversation in ``$REPLAYSAFE_CRASHTEST_DIR`` (the order ids done so far) and its
ledger where ``REPLAYSAFE_LEDGER_URL`` says, and makes one refund per order: a provider call
marked as a side effect, inside a protected tool (or not, for the agents that get it wrong).
"""

from __future__ import annotations

import builtins
import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from replaysafe import Ledger, MemoryLedger, open_ledger, replay_safe, tool_call
from replaysafe.testing import side_effect

ORDERS = ("A1", "B2")


@side_effect
def bank_refund(order: str) -> str:
    """The provider's side effect."""
    return f"re_{order}"


@side_effect
def send_sms(text: str) -> None:
    """A side effect nobody protected."""


def _folder() -> Path:
    return Path(os.environ["REPLAYSAFE_CRASHTEST_DIR"])


def _loop(refund: Callable[[str], Any], *, ids: Callable[[int], tuple[str, str, str]] | None = None) -> None:
    """The agent's loop: each order not yet done is refunded (under its call's ids), then saved as done."""
    state = _folder() / "done.json"
    done: list[str] = json.loads(state.read_text()) if state.exists() else []
    for turn, order in enumerate(ORDERS):
        if order in done:
            continue
        with tool_call(*(ids(turn) if ids else ("thread-1", f"msg_{turn}", "call_1"))):
            refund(order)
        done.append(order)
        state.write_text(json.dumps(done))


def _refund_tool(ledger: Ledger) -> Callable[[str], Any]:
    @replay_safe(ledger=ledger, name="refund_order")
    def refund_order(order: str) -> dict[str, str]:
        return {"refund": bank_refund(order)}

    return refund_order


def protected() -> None:
    """Every side effect inside a protected tool: every case holds."""
    with open_ledger(os.environ["REPLAYSAFE_LEDGER_URL"]) as ledger:
        _loop(_refund_tool(ledger))


def with_an_sms() -> None:
    """A protected refund, then an SMS nobody protected."""
    with open_ledger(os.environ["REPLAYSAFE_LEDGER_URL"]) as ledger:
        refund = _refund_tool(ledger)

        def refund_and_tell(order: str) -> None:
            refund(order)
            send_sms("refunded")

        _loop(refund_and_tell)


def without_replaysafe() -> None:
    """The same agent with its tool left plain: a crash after a refund refunds again on resume."""
    _loop(bank_refund)


def forgetful_ledger() -> None:
    """A protected tool whose ledger does not survive the process: its records die with it."""
    _loop(_refund_tool(MemoryLedger()))


def new_ids_each_run() -> None:
    """A model that answers with new ids on every run: no case can be reached again."""
    with open_ledger(os.environ["REPLAYSAFE_LEDGER_URL"]) as ledger:
        _loop(_refund_tool(ledger), ids=lambda turn: ("thread-1", uuid.uuid4().hex, "call_1"))


def hangs_on_resume() -> None:
    """Refunds, and once a crashed run has left its state, never finishes (the resume hangs)."""
    if (_folder() / "done.json").exists() or (_folder() / "started").exists():
        time.sleep(3600)
    (_folder() / "started").touch()
    protected()


def no_tool_call() -> None:
    """Makes no protected call and no marked side effect."""


def fails_first() -> None:
    raise RuntimeError("the agent's configuration is missing")


def replans_with_new_ids() -> None:
    """A model asked again after a restart answers with new ids: the refund is a new call, made twice."""
    boots = _folder() / "boots"
    boot = int(boots.read_text()) + 1 if boots.exists() else 1
    boots.write_text(str(boot))
    with open_ledger(os.environ["REPLAYSAFE_LEDGER_URL"]) as ledger:
        _loop(_refund_tool(ledger), ids=lambda turn: ("thread-1", f"msg_{turn}", f"call_{boot}"))


class NeedsApproval(Exception):
    """Pauses the refund until a human approves it."""


def pauses_for_approval() -> None:
    """The refund pauses once for approval and is resumed in the same run: its body starts twice in every run."""
    with open_ledger(os.environ["REPLAYSAFE_LEDGER_URL"]) as ledger:

        @replay_safe(ledger=ledger, name="refund_order", pause_on=NeedsApproval)
        def refund_order(order: str) -> dict[str, str]:
            if not (_folder() / f"approved-{order}").exists():
                raise NeedsApproval
            return {"refund": bank_refund(order)}

        def refund_once_approved(order: str) -> None:
            try:
                refund_order(order)
            except NeedsApproval:
                (_folder() / f"approved-{order}").touch()
                refund_order(order)

        _loop(refund_once_approved)


def in_a_task_group() -> None:
    """The agent's errors come out of a task group (anyio, asyncio.TaskGroup) wrapped in an exception group."""
    try:
        protected()
    except Exception as exc:
        raise builtins.ExceptionGroup("unhandled errors in a task group", [exc]) from None  # Python 3.11+


def _boot() -> int:
    """Which run of the case this is in its folder: 1 for the first, 2 for a resume after a crash."""
    boots = _folder() / "boots"
    boot = int(boots.read_text()) + 1 if boots.exists() else 1
    boots.write_text(str(boot))
    return boot


def replans_another_order() -> None:
    """After a restart the model asks for the second refund with another order (Z9 for B2), under the same ids."""
    global ORDERS
    if _boot() > 1:
        ORDERS = ("A1", "Z9")
    protected()


def repeats_one_refund_and_drops_the_other() -> None:
    """Plain refunds; after a restart the model asks for the first refund again and forgets the second: the count
    by name matches a run that is not killed, the count by arguments does not."""
    global ORDERS
    if _boot() > 1:
        ORDERS = ("A1",)
    without_replaysafe()


def approved_by_its_human() -> None:
    """A refund that runs only on an approval: the loop asks its human, who approves (the answer kept in the
    folder before it is recorded), then runs the approved call."""
    from replaysafe import ApprovalRequiredError, approvals

    with open_ledger(os.environ["REPLAYSAFE_LEDGER_URL"]) as ledger:

        @replay_safe(ledger=ledger, name="refund_order", needs_approval=True)
        def refund_order(order: str) -> dict[str, str]:
            return {"refund": bank_refund(order)}

        def refund_once_approved(order: str) -> None:
            try:
                refund_order(order)
            except ApprovalRequiredError as asked:
                approvals.approve(asked, by="ana", ledger=ledger)
                refund_order(order)

        _loop(refund_once_approved)


def refunds_again_when_started_once_more() -> None:
    """A protected agent that, started a third time after it was done, refunds the first order again under new
    ids (a kept answer applied twice, a cleanup that redoes work)."""
    boot = _boot()
    protected()
    if boot == 3:
        with open_ledger(os.environ["REPLAYSAFE_LEDGER_URL"]) as ledger, tool_call("thread-1", "msg_again", "call_1"):
            _refund_tool(ledger)("A1")
