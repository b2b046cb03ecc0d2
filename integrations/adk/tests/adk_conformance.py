"""The conformance kit's driver for Google ADK (``replaysafe.testing.conformance``).

A real ``LlmAgent`` on the scripted model (``replaysafe_adk.testing.ScriptedLlm``), its tools the kit's functions
as ADK makes them (``FunctionTool``), in a resumable ``App`` with ``ReplaySafePlugin`` (the control: without it).
Its session is ADK's ``SqliteSessionService`` on a file in the run's folder: ADK saves the model's event, with
its function calls, before any of them runs, and the calls' responses once they all ran. A run that finds the
session unfinished resumes its invocation (``Runner.run_async(invocation_id=...)``), which runs the calls that
have no saved response again under the ids it saved.

The kit imports this module by name in its child processes, which get the test process's import path.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from google.adk.agents import LlmAgent
from google.adk.apps import App, ResumabilityConfig
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import Runner
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.adk.tools.function_tool import FunctionTool
from google.genai import types

from replaysafe.testing.conformance import AgentRun
from replaysafe_adk import ReplaySafePlugin, replaysafe_error
from replaysafe_adk.testing import ScriptedLlm, stable_ids

APP = "support"
USER = "ana"
PROMPT = "Handle order A1 for ana@example.com"


class AdkDriver:
    """Builds the agent of ``run`` and runs it to the script's end, resuming the saved invocation."""

    #: ADK saves the model's event before its calls run and resumes an invocation under the ids it saved: a
    #: resume never asks the model again for a turn it answered, so no call is re-planned under new ids.
    not_applicable: ClassVar[dict[str, str]] = {
        "replan_args": "ADK saves the model's function calls before any runs, and a resumable app resumes them "
        "under the saved ids: the model is not asked again for that turn (tests/test_adk.py covers key='args' "
        "for a turn asked again in a new invocation)"
    }

    async def _run(self, run: AgentRun) -> None:
        stable_ids(f"{run.script.name}|{run.boot}")  # the same ids as an unkilled run; new ones after a restart
        service = SqliteSessionService(str(run.folder / "sessions.db"))
        tools: list[Any] = [FunctionTool(function) for function in run.tools.values()]
        agent = LlmAgent(name="support", model=ScriptedLlm(script=run.script), tools=tools)
        plugins: list[BasePlugin] = [ReplaySafePlugin(run.ledger, **run.options)] if run.protect else []
        app = App(
            name=APP, root_agent=agent, plugins=plugins, resumability_config=ResumabilityConfig(is_resumable=True)
        )
        runner = Runner(app=app, session_service=service)
        session = await service.get_session(app_name=APP, user_id=USER, session_id=run.thread_id)
        if session is None:
            await service.create_session(app_name=APP, user_id=USER, session_id=run.thread_id)
            events = runner.run_async(
                user_id=USER,
                session_id=run.thread_id,
                new_message=types.Content(role="user", parts=[types.Part(text=PROMPT)]),
            )
        elif session.events and session.events[-1].is_final_response():
            return
        else:
            events = runner.run_async(
                user_id=USER, session_id=run.thread_id, invocation_id=session.events[-1].invocation_id
            )
        try:
            async for _ in events:
                pass
        except RuntimeError as error:  # ADK wraps a plugin's error: the run ends with replaysafe's own
            own = replaysafe_error(error)
            if own is None:
                raise
            raise own from error
        finally:
            await runner.close()

    def run(self, run: AgentRun) -> None:
        asyncio.run(self._run(run))


DRIVER = AdkDriver()
