"""Runs a real ADK agent for the tests: an ``LlmAgent`` in a resumable ``App`` on ADK's runner and sessions."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.apps import App, ResumabilityConfig
from google.adk.events.event import Event
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.sessions.base_session_service import BaseSessionService
from google.adk.tools.base_tool import BaseTool
from google.genai import types

from replaysafe_adk import replaysafe_error
from replaysafe_adk.testing import model_turn

APP = "support"
USER = "ana"


class CallOneLlm(BaseLlm):
    """A model that numbers its calls ``call_1``, ``call_2`` on every turn (as many providers and gateways do)."""

    model: str = "call-one"
    turns: list[list[tuple[str, dict[str, Any]]]]

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        turn = model_turn(llm_request)
        if turn < len(self.turns):
            calls = self.turns[turn]
            parts = [
                types.Part(function_call=types.FunctionCall(name=name, args=args, id=f"call_{number}"))
                for number, (name, args) in enumerate(calls, start=1)
            ]
        else:
            parts = [types.Part(text="done")]
        yield LlmResponse(content=types.Content(role="model", parts=parts), turn_complete=True)


class Agent:
    """One agent on one session service: ``send`` starts an invocation, ``resume`` continues the last one."""

    def __init__(
        self,
        model: BaseLlm,
        tools: Sequence[Callable[..., Any] | BaseTool],
        plugins: Sequence[BasePlugin],
        *,
        session_id: str = "thread-1",
        service: BaseSessionService | None = None,
    ) -> None:
        agent = LlmAgent(name="support", model=model, tools=list(tools))
        app = App(
            name=APP,
            root_agent=agent,
            plugins=list(plugins),
            resumability_config=ResumabilityConfig(is_resumable=True),
        )
        self.service = service or InMemorySessionService()
        self.runner = Runner(app=app, session_service=self.service)
        self.session_id = session_id

    async def events(self) -> list[Event]:
        session = await self.service.get_session(app_name=APP, user_id=USER, session_id=self.session_id)
        return list(session.events) if session is not None else []

    async def _drain(self, stream: AsyncGenerator[Event, None]) -> list[Event]:
        try:
            return [event async for event in stream]
        except RuntimeError as error:  # ADK wraps a plugin's error: raise replaysafe's own
            own = replaysafe_error(error)
            if own is None:
                raise
            raise own from error

    async def send(self, message: str | types.Part) -> list[Event]:
        if await self.service.get_session(app_name=APP, user_id=USER, session_id=self.session_id) is None:
            await self.service.create_session(app_name=APP, user_id=USER, session_id=self.session_id)
        part = types.Part(text=message) if isinstance(message, str) else message
        content = types.Content(role="user", parts=[part])
        return await self._drain(self.runner.run_async(user_id=USER, session_id=self.session_id, new_message=content))

    async def resume(self) -> list[Event]:
        last = (await self.events())[-1]
        return await self._drain(
            self.runner.run_async(user_id=USER, session_id=self.session_id, invocation_id=last.invocation_id)
        )

    async def close(self) -> None:
        await self.runner.close()


def calls_of(events: Sequence[Event]) -> list[tuple[str, str]]:
    """``(event id, function call id)`` of every call the model made, in order."""
    return [(event.id, call.id or "") for event in events for call in event.get_function_calls()]
