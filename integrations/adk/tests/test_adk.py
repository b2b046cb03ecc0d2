"""``ReplaySafePlugin`` on real ADK runs: keys, parallel calls, sync and async tools, tools that raise or are
cancelled, confirmations, missing ids and re-planned calls. The crash cases are the conformance kit's
(tests/test_adk_conformance.py), with real SIGKILLs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from google.adk.apps import App
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.tool_context import ToolContext
from google.adk.workflow import START, Workflow
from google.genai import types

from replaysafe import (
    CallKey,
    Ledger,
    MissingCallIdError,
    SqliteLedger,
    Status,
    UnprotectedCallWarning,
    current_call,
    replay_safe,
)
from replaysafe.testing import Script, ScriptedCall, kill_point, run_in_child
from replaysafe_adk import ReplaySafePlugin, replaysafe_error
from replaysafe_adk.testing import ScriptedLlm

from adk_harness import APP, USER, Agent, CallOneLlm, calls_of

THREAD = "thread-1"


def statuses(ledger: Ledger) -> dict[str, Status]:
    """Each record's status, by its tool's name."""
    return {record.tool_name: record.status for record in ledger.records()}


async def test_each_call_is_keyed_by_session_model_event_and_function_call_id(ledger: SqliteLedger) -> None:
    """A sync and an async tool of one turn see their own call; the record's key is ADK's ids, as saved."""
    seen: dict[str, CallKey] = {}

    def refund_order(order_id: str) -> str:
        """Refund an order (a sync tool)."""
        seen["refund_order"] = current_call().key
        return f"re_{order_id}"

    async def send_email(to: str) -> str:
        """Email a customer (an async tool)."""
        seen["send_email"] = current_call().key
        return f"sent to {to}"

    script = Script(
        ((ScriptedCall("refund_order", {"order_id": "A1"}), ScriptedCall("send_email", {"to": "ana@example.com"})),),
        name="keys",
    )
    agent = Agent(ScriptedLlm(script=script), [refund_order, send_email], [ReplaySafePlugin(ledger)])
    await agent.send("Refund A1 and tell Ana")
    (event_id, refund_id), (same_event, email_id) = calls_of(await agent.events())
    assert event_id == same_event
    assert refund_id.startswith("adk-")  # Gemini gives no call ids: ADK mints them
    assert seen == {
        "refund_order": CallKey(THREAD, event_id, refund_id),
        "send_email": CallKey(THREAD, event_id, email_id),
    }
    assert {record.key for record in ledger.records()} == set(seen.values())
    assert set(statuses(ledger).values()) == {Status.COMPLETED}


async def test_parallel_calls_run_side_by_side_each_under_its_own_key(ledger: SqliteLedger) -> None:
    """Two async tools of one turn are both running at once (each waits for the other to start); each claims and
    records under its own call id, and a sync sibling too."""
    started: list[str] = []
    both = asyncio.Event()

    async def refund_order(order_id: str) -> dict[str, Any]:
        """Refund an order."""
        started.append(order_id)
        if len(started) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), timeout=30)  # a turn run one call at a time never gets here
        return {"refund": f"re_{order_id}", "key": list(current_call().key)}

    def send_email(to: str) -> dict[str, Any]:
        """Email a customer."""
        return {"sent": to, "key": list(current_call().key)}

    turn = (
        ScriptedCall("refund_order", {"order_id": "A1"}),
        ScriptedCall("refund_order", {"order_id": "B2"}),
        ScriptedCall("send_email", {"to": "ana@example.com"}),
    )
    agent = Agent(
        ScriptedLlm(script=Script((turn,), name="parallel")), [refund_order, send_email], [ReplaySafePlugin(ledger)]
    )
    await agent.send("Refund both")
    calls = calls_of(await agent.events())
    records = {record.key: record for record in ledger.records()}
    assert set(records) == {CallKey(THREAD, event_id, call_id) for event_id, call_id in calls}
    assert len(records) == 3
    assert all(record.status is Status.COMPLETED for record in records.values())
    responses = [
        part.function_response.response
        for event in await agent.events()
        for part in (event.content.parts if event.content else None) or ()
        if part.function_response is not None
    ]
    assert sorted(tuple(response["key"]) for response in responses if response) == sorted(map(tuple, records))


async def test_a_new_turn_with_the_same_call_ids_runs_its_tools(ledger: SqliteLedger) -> None:
    """A model that numbers its calls call_1 on every turn: the model event's id tells the turns apart."""
    refunds: list[str] = []

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        refunds.append(order_id)
        return f"re_{order_id}"

    model = CallOneLlm(turns=[[("refund_order", {"order_id": "A1"})], [("refund_order", {"order_id": "B2"})]])
    agent = Agent(model, [refund_order], [ReplaySafePlugin(ledger)])
    await agent.send("Refund A1, then B2")
    assert refunds == ["A1", "B2"]
    keys = {record.key for record in ledger.records()}
    assert {key.tool_call_id for key in keys} == {"call_1"}
    assert len({key.message_id for key in keys}) == 2


@pytest.mark.parametrize(("options", "status"), [({}, None), ({"record_errors": ConnectionError}, Status.FAILED)])
async def test_a_tool_that_raises_is_not_recorded_unless_record_errors_says(
    sql_ledger: Ledger, options: dict[str, Any], status: Status | None
) -> None:
    """ADK ends the run with the tool's own error (not wrapped): the claim is released, so the call runs again
    when asked again (docs/adapters.md, section 7), unless ``record_errors=`` covers the error."""
    attempts: list[str] = []

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        attempts.append(order_id)
        raise ConnectionError("the bank did not answer")

    script = Script(((ScriptedCall("refund_order", {"order_id": "A1"}),),), name="raises")
    agent = Agent(ScriptedLlm(script=script), [refund_order], [ReplaySafePlugin(sql_ledger, **options)])
    with pytest.raises(ConnectionError):
        await agent.send("Refund A1")
    assert attempts == ["A1"]
    assert statuses(sql_ledger) == ({} if status is None else {"refund_order": status})


async def test_a_call_cancelled_by_a_failing_sibling_is_left_in_doubt(ledger: SqliteLedger) -> None:
    """ADK cancels a turn's other calls when one raises: the cancelled refund may have taken effect, so it is left
    in doubt (a resume settles it by the in-doubt policy: tests/test_adk_conformance.py), not released."""
    refunds: list[str] = []
    refunding = asyncio.Event()

    async def refund_order(order_id: str) -> str:
        """Refund an order."""
        refunds.append(order_id)
        refunding.set()
        await asyncio.Event().wait()  # the bank never answers: cancelled
        return "unreachable"

    async def send_email(to: str) -> str:
        """Email a customer."""
        await refunding.wait()
        raise ConnectionError("the mail server is down")

    turn = (ScriptedCall("refund_order", {"order_id": "A1"}), ScriptedCall("send_email", {"to": "ana@example.com"}))
    agent = Agent(
        ScriptedLlm(script=Script((turn,), name="cancelled")), [refund_order, send_email], [ReplaySafePlugin(ledger)]
    )
    with pytest.raises(ConnectionError):
        await agent.send("Refund A1 and tell Ana")
    assert refunds == ["A1"]
    assert statuses(ledger) == {"refund_order": Status.IN_DOUBT}  # the email raised: released, not recorded


def confirmation_answer(events: list[Any], confirmed: bool) -> types.Part:
    """The user's answer to ADK's confirmation request among ``events``."""
    (request,) = [
        call for event in events for call in event.get_function_calls() if call.name == "adk_request_confirmation"
    ]
    return types.Part(
        function_response=types.FunctionResponse(
            name="adk_request_confirmation", id=request.id, response={"confirmed": confirmed}
        )
    )


async def test_a_step_before_a_confirmation_runs_once_across_the_pause(ledger: SqliteLedger) -> None:
    """The tool holds the money (a step), then asks for confirmation: the call is paused, not recorded; once
    confirmed it runs again, the hold replays, and the refund runs once. Resuming after that replays the call."""
    effects: list[str] = []

    @replay_safe(ledger=ledger)
    def hold_funds(order_id: str) -> str:
        effects.append(f"hold {order_id}")
        return f"hold_{order_id}"

    def refund_order(order_id: str, tool_context: ToolContext) -> dict[str, str]:
        """Refund an order, once a human confirms it."""
        hold = hold_funds(order_id)
        if tool_context.tool_confirmation is None:
            tool_context.request_confirmation(hint=f"Refund order {order_id}?")
            return {"status": "waiting for confirmation"}
        effects.append(f"refund {order_id}")
        return {"refund": f"re_{order_id}", "hold": hold}

    script = Script(((ScriptedCall("refund_order", {"order_id": "A1"}),), "Refunded."), name="confirm")
    agent = Agent(ScriptedLlm(script=script), [refund_order], [ReplaySafePlugin(ledger)])
    paused = await agent.send("Refund A1")
    assert effects == ["hold A1"]
    assert statuses(ledger)["refund_order"] is Status.PAUSED

    await agent.send(confirmation_answer(paused, confirmed=True))
    assert effects == ["hold A1", "refund A1"]
    assert statuses(ledger)["refund_order"] is Status.COMPLETED
    assert (await agent.events())[-1].is_final_response()


#: Where the first process of the crash test below dies: the confirmation asked for and saved in the session.
CONFIRMING = "waiting-for-a-confirmation"


async def confirmation_child(ledger_path: str, sessions_path: str, effects_path: str, protect: bool) -> list[str]:
    """One process of the refund of the test above, on ADK's ``SqliteSessionService`` (a file).

    With a new session it asks for the refund: the tool holds the money (a ``@replay_safe`` step, a line appended
    to ``effects_path`` each time it runs), asks for confirmation, and ADK saves the request in the session; then
    the process is SIGKILLed (``kill_point``) while nobody has answered. With a saved session it sends the
    confirmation: ADK runs the tool again from its top. ``protect=False`` is the same agent without the plugin.
    """
    effects = Path(effects_path)
    with SqliteLedger(ledger_path) as ledger:

        @replay_safe(ledger=ledger)
        def hold_funds(order_id: str) -> str:
            with effects.open("a") as file:
                file.write(f"{order_id}\n")
            return f"hold_{order_id}"

        def refund_order(order_id: str, tool_context: ToolContext) -> dict[str, str]:
            """Refund an order, once a human confirms it."""
            hold = hold_funds(order_id)
            if tool_context.tool_confirmation is None:
                tool_context.request_confirmation(hint=f"Refund order {order_id}?")
                return {"status": "waiting for confirmation"}
            return {"refund": f"re_{order_id}", "hold": hold}

        script = Script(((ScriptedCall("refund_order", {"order_id": "A1"}),), "Refunded."), name="confirm-crash")
        plugins = [ReplaySafePlugin(ledger)] if protect else []
        service = SqliteSessionService(sessions_path)
        agent = Agent(ScriptedLlm(script=script), [refund_order], plugins, service=service)
        try:
            saved = await agent.events()
            if not saved:
                await agent.send("Refund A1")
                kill_point(CONFIRMING)  # SIGKILL: the process dies while the confirmation is unanswered
                raise AssertionError("the agent was not killed at the confirmation")
            answered = await agent.send(confirmation_answer(saved, confirmed=True))
            return [part.text for event in answered if event.content for part in event.content.parts or () if part.text]
        finally:
            await agent.close()


@pytest.mark.parametrize("protect", [True, False], ids=["plugin", "control"])
def test_a_step_before_a_confirmation_runs_once_across_a_kill_in_the_pause(tmp_path: Path, protect: bool) -> None:
    """The test above across processes: the first holds the money, asks for confirmation and is SIGKILLed once
    ADK saved the request in its SQLite session; a new process sends the confirmation on that session. ADK runs
    the tool again from its top: with the plugin the call was kept paused in the ledger file, so the hold
    replays; the control, the same agent without the plugin, holds the money twice."""
    ledger_path, effects = tmp_path / "ledger.db", tmp_path / "effects.txt"
    args = (str(ledger_path), str(tmp_path / "sessions.db"), str(effects), protect)
    killed = run_in_child(confirmation_child, *args, kill_at=CONFIRMING, timeout=60)
    assert killed.killed
    assert effects.read_text().split() == ["A1"]
    assert ("hold_funds ran WITHOUT replay protection" in killed.stderr) is not protect  # the control's step, said
    with SqliteLedger(ledger_path) as ledger:  # what the killed process left: the call paused, its hold recorded
        assert statuses(ledger) == ({"refund_order": Status.PAUSED, "hold_funds": Status.COMPLETED} if protect else {})

    resumed = run_in_child(confirmation_child, *args, timeout=60)
    assert resumed.value == ["Refunded."]  # the model's answer, once the confirmed refund ran
    assert effects.read_text().split() == (["A1"] if protect else ["A1", "A1"])


async def test_a_tool_that_requires_confirmation_runs_once_approved(ledger: SqliteLedger) -> None:
    """ADK's confirmation gate answers the call before the tool runs: that answer is not the call's outcome."""
    refunds: list[str] = []

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        refunds.append(order_id)
        return f"re_{order_id}"

    script = Script(((ScriptedCall("refund_order", {"order_id": "A1"}),), "Refunded."), name="gate")
    tool = FunctionTool(refund_order, require_confirmation=True)
    agent = Agent(ScriptedLlm(script=script), [tool], [ReplaySafePlugin(ledger)])
    paused = await agent.send("Refund A1")
    assert refunds == []
    await agent.send(confirmation_answer(paused, confirmed=True))
    assert refunds == ["A1"]
    # The call, and the human's answer recorded once (tests/test_adk_approvals.py)
    assert statuses(ledger) == {"refund_order": Status.COMPLETED, "adk_request_confirmation": Status.COMPLETED}


class ReplanLlm(BaseLlm):
    """Asked after a user's message, it asks for the refund of A1 (ADK gives the call a new id each time)."""

    model: str = "replan"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        last = llm_request.contents[-1]
        if last.role == "user" and any(part.text for part in last.parts or ()):
            part = types.Part(function_call=types.FunctionCall(name="refund_order", args={"order_id": "A1"}))
        else:
            part = types.Part(text="done")
        yield LlmResponse(content=types.Content(role="model", parts=[part]), turn_complete=True)


@pytest.mark.parametrize(("key", "runs"), [("args", 1), ("call", 2)])
async def test_a_call_asked_for_again_in_a_new_invocation_replays_under_key_args(
    ledger: SqliteLedger, key: str, runs: int
) -> None:
    """A user who sends the request again gets a new model answer with new ids: key="args" makes it one call."""
    refunds: list[str] = []

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        refunds.append(order_id)
        return f"re_{order_id}"

    agent = Agent(ReplanLlm(), [refund_order], [ReplaySafePlugin(ledger, key=key)])
    await agent.send("Refund A1")
    await agent.send("Did you refund A1? Do it now.")
    assert refunds == ["A1"] * runs


async def test_a_decorated_tool_protects_itself_under_the_calls_ids(ledger: SqliteLedger) -> None:
    """A @replay_safe function is claimed by itself, with its own options, under the ids the plugin sets."""
    refunds: list[str] = []

    @replay_safe(ledger=ledger, name="refund")
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        refunds.append(order_id)
        return f"re_{order_id}"

    script = Script(((ScriptedCall("refund_order", {"order_id": "A1"}),),), name="decorated")
    agent = Agent(ScriptedLlm(script=script), [FunctionTool(refund_order)], [ReplaySafePlugin(ledger)])
    await agent.send("Refund A1")
    ((event_id, call_id),) = calls_of(await agent.events())
    (record,) = ledger.records()
    assert (record.key, record.tool_name, record.status) == (
        CallKey(THREAD, event_id, call_id),
        "refund",
        Status.COMPLETED,
    )
    assert refunds == ["A1"]


async def run_workflow(plugin: ReplaySafePlugin, tool: FunctionTool, times: int) -> None:
    """A Workflow whose only node is ``tool``: ADK mints its call id again on every run, outside any model turn."""
    service = InMemorySessionService()
    runner = Runner(
        app=App(name=APP, root_agent=Workflow(name="refunds", edges=[(START, tool)]), plugins=[plugin]),
        session_service=service,
    )
    try:
        for _ in range(times):
            session = await service.create_session(app_name=APP, user_id=USER, session_id=THREAD)
            message = types.Content(role="user", parts=[types.Part(text="A1")])
            async for _ in runner.run_async(user_id=USER, session_id=session.id, new_message=message):
                pass
            await service.delete_session(app_name=APP, user_id=USER, session_id=THREAD)
    finally:
        await runner.close()


async def test_a_call_no_model_event_holds_warns_once_per_tool_naming_the_missing_id(sql_ledger: Ledger) -> None:
    refunds: list[str] = []

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        refunds.append(order_id)
        return f"re_{order_id}"

    with pytest.warns(UnprotectedCallWarning) as warned:
        await run_workflow(ReplaySafePlugin(sql_ledger), FunctionTool(refund_order), times=2)
    assert refunds == ["A1", "A1"]  # run, unprotected
    assert len(warned) == 1  # once per tool, not per call
    message = str(warned[0].message)
    assert "message_id is empty" in message
    assert "Workflow's tool node" in message
    assert 'key="args"' in message
    assert "use an adapter" not in message
    assert list(sql_ledger.records()) == []


async def test_a_call_no_model_event_holds_is_refused_under_on_missing_ids_raise(ledger: SqliteLedger) -> None:
    refunds: list[str] = []

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        refunds.append(order_id)
        return f"re_{order_id}"

    with pytest.raises(RuntimeError) as raised:
        await run_workflow(ReplaySafePlugin(ledger, on_missing_ids="raise"), FunctionTool(refund_order), times=1)
    own = replaysafe_error(raised.value)
    assert isinstance(own, MissingCallIdError)
    assert "message_id is empty" in str(own)
    assert refunds == []


class Redacting(BasePlugin):
    """A plugin that replaces every tool response (ADK then runs no later plugin's after-tool callback)."""

    def __init__(self) -> None:
        super().__init__(name="redacting")

    async def after_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext, result: Any
    ) -> dict[str, Any] | None:
        return {"result": "redacted"}


async def test_a_call_a_plugin_listed_before_it_answers_is_left_in_doubt_not_claimed_forever(
    ledger: SqliteLedger,
) -> None:
    """Listed after a plugin that replaces the response, the plugin never sees the call end: once the run ends the
    call is in doubt (the tool ran, its response unknown), and a later attempt settles it by the in-doubt policy."""
    refunds: list[str] = []

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        refunds.append(order_id)
        return f"re_{order_id}"

    script = Script(((ScriptedCall("refund_order", {"order_id": "A1"}),), "Refunded."), name="order")
    agent = Agent(ScriptedLlm(script=script), [refund_order], [Redacting(), ReplaySafePlugin(ledger)])
    await agent.send("Refund A1")
    assert refunds == ["A1"]
    assert statuses(ledger) == {"refund_order": Status.IN_DOUBT}
