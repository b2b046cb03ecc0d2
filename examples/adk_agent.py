"""A Google ADK support agent, crash-tested offline.

Crash-test it with ``replaysafe crashtest examples/adk_agent.py:main --jobs 2``.

The agent looks an order up, then refunds it and emails the customer (two calls in one model turn), then
answers. Its model is scripted (``replaysafe_adk.testing.ScriptedLlm``): no network; ADK mints the ids as it
always does, from a fixed sequence (``stable_ids``), so a run started from the beginning sees the ids a killed
one saw. Its session is ADK's ``SqliteSessionService`` in ``$REPLAYSAFE_CRASHTEST_DIR``, in a resumable ``App``:
ADK saves the model's function calls before they run and their responses once all of a turn's calls ran. A run
that finds the session unfinished resumes the invocation, which runs that turn's calls again under their saved
ids, and ``ReplaySafePlugin`` replays each call that had finished. The provider calls are marked with
``@side_effect``, so the crash test counts them.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from google.adk.agents import LlmAgent
from google.adk.apps import App, ResumabilityConfig
from google.adk.runners import Runner
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.genai import types
from replaysafe_adk import ReplaySafePlugin, replaysafe_error
from replaysafe_adk.testing import ScriptedLlm, stable_ids

from replaysafe import Ledger, open_ledger
from replaysafe.testing import Script, ScriptedCall, side_effect

APP = "support"
USER = "ana"
CONVERSATION = "support-order-A1"
SCRIPT = Script(
    (
        (ScriptedCall("lookup_order", {"order_id": "A1"}),),
        (
            ScriptedCall("refund_order", {"order_id": "A1", "amount_cents": 4200}),
            ScriptedCall("email_customer", {"to": "ana@example.com", "text": "Your refund of 42.00 is on its way."}),
        ),
        "Order A1 is refunded and Ana has been told.",
    ),
    name=CONVERSATION,
)


@side_effect
def bank_refund(order_id: str, amount_cents: int) -> str:
    """The payment provider's refund: money moves (counted by the crash test)."""
    return f"re_{order_id}_{amount_cents}"


@side_effect
def smtp_send(to: str, text: str) -> str:
    """The mail provider: a customer gets an email (counted by the crash test)."""
    return f"queued for {to}"


def lookup_order(order_id: str) -> dict[str, object]:
    """Look an order up."""
    return {"order_id": order_id, "customer": "ana@example.com", "total_cents": 4200}


def refund_order(order_id: str, amount_cents: int) -> str:
    """Refund an order."""
    return bank_refund(order_id, amount_cents)


def email_customer(to: str, text: str) -> str:
    """Email a customer."""
    return smtp_send(to, text)


def build_app(ledger: Ledger) -> App:
    """The agent in a resumable app, every tool call of its runner claimed and recorded by the plugin."""
    agent = LlmAgent(
        name="support", model=ScriptedLlm(script=SCRIPT), tools=[lookup_order, refund_order, email_customer]
    )
    return App(
        name=APP,
        root_agent=agent,
        plugins=[ReplaySafePlugin(ledger)],
        resumability_config=ResumabilityConfig(is_resumable=True),
    )


async def run_agent(ledger: Ledger, folder: Path) -> str:
    """Run the conversation to its answer, resuming the saved invocation if a run was killed in it."""
    service = SqliteSessionService(str(folder / "sessions.db"))
    session = await service.get_session(app_name=APP, user_id=USER, session_id=CONVERSATION)
    # ADK mints event and call ids: from the start, the same as any run from the start; resumed, new ones.
    stable_ids(f"{CONVERSATION}|{len(session.events) if session else 0}")
    runner = Runner(app=build_app(ledger), session_service=service)
    try:
        if session is None:
            await service.create_session(app_name=APP, user_id=USER, session_id=CONVERSATION)
            prompt = types.Content(role="user", parts=[types.Part(text="Ana says order A1 arrived broken: refund it.")])
            events = runner.run_async(user_id=USER, session_id=CONVERSATION, new_message=prompt)
        elif session.events[-1].is_final_response():
            return session.events[-1].content.parts[0].text or ""  # type: ignore[union-attr]  # answered already
        else:
            invocation = session.events[-1].invocation_id
            events = runner.run_async(user_id=USER, session_id=CONVERSATION, invocation_id=invocation)
        answer = ""
        async for event in events:
            if event.is_final_response() and event.content and event.content.parts:
                answer = event.content.parts[0].text or ""
        return answer
    except RuntimeError as error:  # ADK wraps a plugin's error: end with replaysafe's own (a call in doubt...)
        own = replaysafe_error(error)
        if own is None:
            raise
        raise own from error
    finally:
        await runner.close()


def main() -> None:
    """The crash test's entry point: state in ``$REPLAYSAFE_CRASHTEST_DIR``, ledger from ``$REPLAYSAFE_LEDGER_URL``."""
    folder = Path(os.environ.get("REPLAYSAFE_CRASHTEST_DIR", ".adk_agent"))
    folder.mkdir(parents=True, exist_ok=True)
    url = os.environ.get("REPLAYSAFE_LEDGER_URL", f"sqlite:///{folder / 'ledger.db'}")
    with open_ledger(url) as ledger:
        print(asyncio.run(run_agent(ledger, folder)))


if __name__ == "__main__":
    main()
