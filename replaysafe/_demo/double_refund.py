"""``replaysafe demo``: the double refund, with and without ``@replay_safe``.

A small agent run loop saves the node it is about to run, as LangGraph does,
then runs the assistant message's tool calls. The first process is SIGKILLed
right after ``refund_order`` returns (the refund went through, the node did not
finish); a new process resumes the run and runs the node again from the top.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .._context import tool_call
from .._decorator import replay_safe
from ..ledgers.sqlite import SqliteLedger

THREAD = "support-thread-42"
#: The agent's code that makes the difference; the unprotected story runs the same loop without it.
THE_TWO_LINES = (
    '@replay_safe(ledger=SqliteLedger("ledger.db"))          # on each tool with a side effect',
    'with tool_call(thread_id, message["id"], call["id"]):   # around each call (an adapter does this for you)',
)
# The assistant message the model produced, persisted with the run's state.
MESSAGE: dict[str, Any] = {
    "id": "msg_7",
    "tool_calls": [
        {"id": "call_1", "name": "refund_order", "args": {"order_id": "1042", "amount": 59.0}},
        {"id": "call_2", "name": "send_email", "args": {"to": "ana@example.com", "subject": "Your refund"}},
    ],
}


def _append(path: Path, line: str) -> None:
    with path.open("a") as log:
        log.write(line + "\n")
        log.flush()
        os.fsync(log.fileno())


def _say(text: str) -> None:
    print(text, flush=True)


def agent_process(workdir: Path, protected: bool) -> None:
    """One agent process: resume the run from its saved node and run the node's tool calls."""
    payments = workdir / "payments.log"
    state_file = workdir / "state.json"
    ledger = SqliteLedger(workdir / "ledger.db")

    def refund_order(order_id: str, amount: float) -> str:
        """Refund an order through the payment provider."""
        _append(payments, f"refund {order_id} {amount:.2f}")
        return f"Refunded {amount:.2f} for order {order_id}"

    def send_email(to: str, subject: str) -> str:
        """Send an email."""
        return f"Sent {subject!r} to {to}"

    tools: dict[str, Any] = {"refund_order": refund_order, "send_email": send_email}
    if protected:
        tools = {name: replay_safe(ledger=ledger)(tool) for name, tool in tools.items()}

    state: dict[str, Any] = {"node": "tools", "attempts": 0}
    if state_file.exists():
        state = json.loads(state_file.read_text())
    state["attempts"] += 1
    # The run loop saves the node before it runs it: a killed process re-runs the whole node.
    state_file.write_text(json.dumps(state))
    _say(f"process {os.getpid()} runs node {state['node']!r} of thread {THREAD!r} (attempt {state['attempts']})")
    for call in MESSAGE["tool_calls"]:
        refunds_before = _count(payments)
        with tool_call(THREAD, MESSAGE["id"], call["id"]) if protected else contextlib.nullcontext():
            result = tools[call["name"]](**call["args"])
        if call["name"] == "send_email":
            how = "email sent"
        elif _count(payments) > refunds_before:
            how = "the provider moved $59.00"
        else:
            how = "recorded result returned, tool not run"
        _say(f"  {call['name']}({_args(call['args'])}) -> {result!r}   [{how}]")
        if call["name"] == "refund_order" and state["attempts"] == 1:
            _say(f"  ** process {os.getpid()} is killed (SIGKILL) before the node finishes **")
            os.kill(os.getpid(), signal.SIGKILL)
    state["node"] = "done"
    state_file.write_text(json.dumps(state))
    _say("  node finished")


def _args(args: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items())


def _count(payments: Path) -> int:
    return len(payments.read_text().splitlines()) if payments.exists() else 0


def _story(protected: bool) -> int:
    title = "WITH the two lines (SQLite ledger)" if protected else "WITHOUT them: the same tools and loop"
    _say(f"\n=== {title} ===")
    with tempfile.TemporaryDirectory(prefix="replaysafe-demo-") as tmp:
        workdir = Path(tmp)
        for attempt in (1, 2):
            if attempt == 2:
                _say("the run resumes in a new process:")
            mode = "protected" if protected else "plain"
            child = subprocess.run(
                [sys.executable, "-m", "replaysafe._demo.double_refund", "agent", str(workdir), mode],
                stdout=subprocess.PIPE,
                text=True,
                check=False,
            )
            sys.stdout.write(child.stdout)
            if attempt == 1 and child.returncode != -signal.SIGKILL:
                raise RuntimeError(f"the demo's first agent process should have been killed, got {child.returncode}")
            if attempt == 2 and child.returncode != 0:
                raise RuntimeError(f"the resumed agent process failed with exit code {child.returncode}")
        refunds = _count(workdir / "payments.log")
    verdict = "once. Correct." if refunds == 1 else f"{refunds} times: $59.00 refunded twice."
    _say(f"result: the customer was refunded {verdict}")
    return refunds


def main() -> int:
    """Tell the story twice and return 0 when it came out as it should."""
    _say("replaysafe demo: an agent process is killed right after refund_order returns, then resumes.")
    _say("The two lines of the agent's code that make the difference:")
    for line in THE_TWO_LINES:
        _say(f"    {line}")
    protected = _story(protected=True)
    plain = _story(protected=False)
    _say(
        f"\nsummary: refunds with replaysafe: {protected}, without: {plain}. The resumed run re-ran the node; "
        "the ledger returned refund_order's recorded result instead of refunding again."
    )
    return 0 if (protected, plain) == (1, 2) else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["agent"]:
        agent_process(Path(sys.argv[2]), sys.argv[3] == "protected")
    else:
        sys.exit(main())
