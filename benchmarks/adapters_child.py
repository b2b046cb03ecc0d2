# mypy: disable-error-code="import-not-found"
# (ADK, CrewAI and Strands Agents are installed in their adapters' environments only, not in the main one.)
"""Section 9's measurement for one adapter, run in that adapter's environment (``benchmarks/adapters.py``).

``python -m benchmarks.adapters_child '<spec as JSON>'`` from the repository root, with the root on
``PYTHONPATH`` (so this package imports, and the ``replaysafe`` measured is this checkout's). In paired
rounds, one block of every configuration per round, in a shuffled order:

* ``framework``: the framework's own agent on the adapter's scripted model (its ``testing`` module), which
  asks for ``calls`` calls of a trivial tool, one per turn, then answers; no adapter;
* ``adapter.<ledger>``: the same agent with the adapter, on a memory ledger and on PostgreSQL;
* ``core.bare``: ``calls`` calls of a plain function (the tool's body);
* ``core.<ledger>``: the same function under ``@replay_safe(ledger=...)``, each call inside ``with
  tool_call(...)``, on the same ledger object the adapter uses.

Every call is a first call (fresh keys: a new thread, session or context for each run of the agent, a new
message id for each core call), and every block checks that the tool ran once per call. Everything a run
builds (the agent, its session, its context) is built before the block's timer starts. It creates one schema
of its own (named in the spec), drops it at the end, and prints one JSON object: seconds per call of every
configuration, one value per round, or why a ledger was not measured. It imports nothing of the benchmark
but its statistics (the adapters' environments have no Powertools, matplotlib or Redis client).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.metadata
import itertools
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from replaysafe import Ledger, MemoryLedger, replay_safe, tool_call
from replaysafe.testing import Script, ScriptedCall

from ._stats import Block, paired_rounds

ORDER_ID = "42"
PROMPT = "Refund order 42"
THREAD = "t"
#: A run of the agent: prepared before the timer (agent, session, context), then run. ``prepare`` returns the run.
Prepare = Callable[[], Callable[[], None]]


class Tool:
    """The trivial tool every configuration calls, counting its runs (a replay must not add one)."""

    def __init__(self) -> None:
        self.runs = 0

        def refund(order_id: str) -> dict[str, str]:
            """Refund an order."""
            self.runs += 1
            return {"refunded": order_id}

        self.function = refund


def script(calls: int) -> Script:
    """The model asks for ``calls`` refunds, one per turn, then answers. One at a time: calls asked for in one
    turn run side by side in most frameworks, which would overlap the ledger's round trips of the adapter's
    calls but not of the core's. Each of another order: CrewAI stops an agent that repeats a call's arguments."""
    turns = tuple((ScriptedCall("refund", {"order_id": f"{ORDER_ID}-{i}"}),) for i in range(calls))
    return Script((*turns, "Refunded."), name=f"bench-{calls}")


_fresh = itertools.count()


def fresh(prefix: str) -> str:
    """A thread or session id no earlier run used: every call of every run is a first call."""
    return f"{prefix}-{os.getpid()}-{next(_fresh)}"


# --- the frameworks: (plain, with the adapter on a ledger) -> a Prepare ---------------------------


def llamaindex(tool: Tool, calls: int, loop: asyncio.AbstractEventLoop) -> Callable[[Ledger | None], Prepare]:
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.memory import ChatMemoryBuffer
    from llama_index.core.tools import FunctionTool
    from llama_index.core.workflow import Context
    from replaysafe_llamaindex import replay_safe_agent
    from replaysafe_llamaindex.testing import scripted_llm

    def build(ledger: Ledger | None) -> Prepare:
        agent: Any = FunctionAgent(
            name="support", tools=[FunctionTool.from_defaults(fn=tool.function)], llm=scripted_llm(script(calls))
        )
        if ledger is not None:  # each run's new Context mints a new thread id (the adapter's default)
            agent = replay_safe_agent(agent, ledger=ledger)

        def prepare() -> Callable[[], None]:
            ctx = Context(agent)
            memory = ChatMemoryBuffer.from_defaults(tokenizer_fn=str.split)  # the default tokenizer downloads

            async def go() -> None:
                await agent.run(user_msg=PROMPT, ctx=ctx, memory=memory)

            return lambda: loop.run_until_complete(go())

        return prepare

    return build


def adk(tool: Tool, calls: int, loop: asyncio.AbstractEventLoop) -> Callable[[Ledger | None], Prepare]:
    from google.adk.agents import LlmAgent
    from google.adk.apps import App
    from google.adk.runners import Runner
    from google.adk.sessions import InMemorySessionService
    from google.adk.tools.function_tool import FunctionTool
    from google.genai import types
    from replaysafe_adk import ReplaySafePlugin
    from replaysafe_adk.testing import ScriptedLlm

    message = types.Content(role="user", parts=[types.Part(text=PROMPT)])

    def build(ledger: Ledger | None) -> Prepare:
        service = InMemorySessionService()
        agent = LlmAgent(name="support", model=ScriptedLlm(script=script(calls)), tools=[FunctionTool(tool.function)])
        plugins = [ReplaySafePlugin(ledger)] if ledger is not None else []
        runner = Runner(app=App(name="support", root_agent=agent, plugins=plugins), session_service=service)

        def prepare() -> Callable[[], None]:
            session = fresh("s")  # a new session (the adapter's thread); ADK mints new event ids too
            loop.run_until_complete(service.create_session(app_name="support", user_id="u", session_id=session))

            async def go() -> None:
                async for _ in runner.run_async(user_id="u", session_id=session, new_message=message):
                    pass

            def run() -> None:
                loop.run_until_complete(go())
                # Dropped right after its run: the service's sessions would pile up over the rounds.
                loop.run_until_complete(service.delete_session(app_name="support", user_id="u", session_id=session))

            return run

        return prepare

    return build


def crewai(tool: Tool, calls: int, loop: asyncio.AbstractEventLoop) -> Callable[[Ledger | None], Prepare]:
    for name in ("CREWAI_DISABLE_TELEMETRY", "OTEL_SDK_DISABLED"):  # offline: no telemetry, no tracing prompt
        os.environ.setdefault(name, "true")
    os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
    from crewai import Agent, Crew, Task
    from crewai.agents.agent_executor import AgentExecutor
    from crewai.tools import tool as crewai_tool
    from replaysafe_crewai import replay_safe_crew, replay_safe_tool
    from replaysafe_crewai.testing import ScriptedLLM

    # The adapter wraps one method of CrewAI's executor, once per process: the framework alone runs the original.
    attribute = "_execute_single_native_tool_call"
    original = getattr(AgentExecutor, attribute)
    replay_safe_tool(crewai_tool("refund")(tool.function), MemoryLedger())  # installs the adapter's wrapper
    wrapped = getattr(AgentExecutor, attribute)

    def build(ledger: Ledger | None) -> Prepare:
        def prepare() -> Callable[[], None]:
            agent = Agent(
                role="support",
                goal="Refund the order",
                backstory="A support agent.",
                llm=ScriptedLLM(script=script(calls)),
                tools=[crewai_tool("refund")(tool.function)],
                max_retry_limit=0,
            )
            task = Task(description=PROMPT, expected_output="A sentence.", agent=agent)
            crew = Crew(agents=[agent], tasks=[task])
            if ledger is not None:
                crew = replay_safe_crew(crew, ledger=ledger, thread_id=fresh("crew"))
            setattr(AgentExecutor, attribute, original if ledger is None else wrapped)

            def run() -> None:
                crew.kickoff()

            return run

        return prepare

    return build


def strands(tool: Tool, calls: int, loop: asyncio.AbstractEventLoop) -> Callable[[Ledger | None], Prepare]:
    from replaysafe_strands import ReplaySafeHooks
    from replaysafe_strands.testing import ScriptedModel
    from strands import Agent
    from strands import tool as strands_tool

    refund = strands_tool(name="refund")(tool.function)

    def build(ledger: Ledger | None) -> Prepare:
        extra: list[Any] = [ReplaySafeHooks(ledger)] if ledger is not None else []

        def prepare() -> Callable[[], None]:
            model = ScriptedModel(script(calls))
            agent = Agent(model=model, tools=[refund], hooks=[model, *extra], callback_handler=None)
            thread = fresh("strands")  # the adapter's thread id, from the invocation state

            def run() -> None:
                agent(PROMPT, invocation_state={"thread_id": thread})

            return run

        return prepare

    return build


def langgraph(tool: Tool, calls: int, loop: asyncio.AbstractEventLoop) -> Callable[[Ledger | None], Prepare]:
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import StructuredTool
    from langgraph.checkpoint.memory import InMemorySaver
    from replaysafe_langgraph import ReplaySafeMiddleware
    from replaysafe_langgraph.testing import scripted_chat_model

    refund = StructuredTool.from_function(tool.function, name="refund")

    def build(ledger: Ledger | None) -> Prepare:
        middleware = [ReplaySafeMiddleware(ledger)] if ledger is not None else []
        # A checkpointer on both sides: the adapter keys a call by the run config's thread_id, as a user's graph has.
        agent = create_agent(
            scripted_chat_model(script(calls)), [refund], middleware=middleware, checkpointer=InMemorySaver()
        )

        def prepare() -> Callable[[], None]:
            config: Any = {"configurable": {"thread_id": fresh("lg")}}
            ask: Any = {"messages": [HumanMessage(PROMPT)]}

            def run() -> None:
                agent.invoke(ask, config)

            return run

        return prepare

    return build


def pydantic_ai(tool: Tool, calls: int, loop: asyncio.AbstractEventLoop) -> Callable[[Ledger | None], Prepare]:
    from pydantic_ai import Agent
    from pydantic_ai import Tool as PydanticTool
    from replaysafe_pydantic_ai import ReplaySafe
    from replaysafe_pydantic_ai.testing import scripted_model

    def build(ledger: Ledger | None) -> Prepare:
        capabilities: list[Any] = [ReplaySafe(ledger)] if ledger is not None else []
        agent: Any = Agent(
            scripted_model(script(calls)),
            tools=[PydanticTool(tool.function, name="refund")],
            capabilities=capabilities,
        )

        def prepare() -> Callable[[], None]:
            conversation = fresh("pa")  # the adapter's thread: the run's conversation_id

            async def go() -> None:
                await agent.run(PROMPT, conversation_id=conversation)

            return lambda: loop.run_until_complete(go())

        return prepare

    return build


def openai_agents(tool: Tool, calls: int, loop: asyncio.AbstractEventLoop) -> Callable[[Ledger | None], Prepare]:
    from agents import Agent, RunConfig, Runner, function_tool
    from replaysafe_openai_agents import context_field, replay_safe_agent
    from replaysafe_openai_agents.testing import scripted_model

    config = RunConfig(tracing_disabled=True)

    def build(ledger: Ledger | None) -> Prepare:
        agent: Any = Agent(
            name="support",
            model=scripted_model(script(calls)),
            tools=[function_tool(tool.function, name_override="refund")],
        )
        if ledger is not None:
            agent = replay_safe_agent(agent, ledger, thread_id=context_field("thread_id"))

        def prepare() -> Callable[[], None]:
            context = {"thread_id": fresh("oa")}

            async def go() -> None:
                await Runner.run(agent, PROMPT, context=context, run_config=config, max_turns=calls + 1)

            return lambda: loop.run_until_complete(go())

        return prepare

    return build


def tenxgraph(tool: Tool, calls: int, loop: asyncio.AbstractEventLoop) -> Callable[[Ledger | None], Prepare]:
    from replaysafe_tenxgraph import replay_safe_tools
    from replaysafe_tenxgraph.testing import scripted_model
    from tenxgraph.core.graph import StateGraph
    from tenxgraph.core.graph.tool_node import ToolNode
    from tenxgraph.core.state import AgentState, Message
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer
    from tenxgraph.utils.constants import END

    def route(state: Any) -> str:
        """ReactAgent's routing: to the ToolNode while the model asks for tools."""
        last = state.context[-1] if state.context else None
        return "TOOL" if last is not None and last.role == "assistant" and last.tools_calls else END

    def build(ledger: Ledger | None) -> Prepare:
        # ReactAgent's graph (it would build a provider client for its model), as the adapter's tests build it.
        tools = replay_safe_tools([tool.function], ledger=ledger) if ledger is not None else [tool.function]
        graph: Any = StateGraph[AgentState]()
        graph.add_node("MAIN", scripted_model(script(calls)))
        graph.add_node("TOOL", ToolNode(tools))
        graph.add_conditional_edges("MAIN", route, {"TOOL": "TOOL", END: END})
        graph.add_edge("TOOL", "MAIN")
        graph.set_entry_point("MAIN")
        checkpointer = InMemoryCheckpointer()
        loop.run_until_complete(checkpointer.asetup())
        app = graph.compile(checkpointer=checkpointer)

        def prepare() -> Callable[[], None]:
            config = {"thread_id": fresh("tx")}  # the adapter's thread id
            ask = {"messages": [Message.text_message(PROMPT, role="user")]}

            async def go() -> None:
                await app.ainvoke(ask, config=config)

            return lambda: loop.run_until_complete(go())

        return prepare

    return build


FRAMEWORKS: dict[str, tuple[Callable[..., Callable[[Ledger | None], Prepare]], str, str]] = {
    # adapter -> (its harness, the framework's distribution, the adapter's)
    "llamaindex": (llamaindex, "llama-index-core", "replaysafe-llamaindex"),
    "adk": (adk, "google-adk", "replaysafe-adk"),
    "crewai": (crewai, "crewai", "replaysafe-crewai"),
    "strands": (strands, "strands-agents", "replaysafe-strands"),
    "langgraph": (langgraph, "langgraph", "replaysafe-langgraph"),
    "pydantic_ai": (pydantic_ai, "pydantic-ai-slim", "replaysafe-pydantic-ai"),
    "openai_agents": (openai_agents, "openai-agents", "replaysafe-openai-agents"),
    "tenxgraph": (tenxgraph, "10xgraph", "replaysafe-10xgraph"),
}


# --- the blocks -----------------------------------------------------------------------------------


def agent_block(prepare: Prepare, tool: Tool, calls: int) -> Block:
    def block(r: int) -> float:
        run = prepare()
        before = tool.runs
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        assert tool.runs - before == calls, f"the tool ran {tool.runs - before} times, not {calls}"
        return elapsed

    return block


def bare_block(tool: Tool, calls: int) -> Block:
    function, orders = tool.function, [f"{ORDER_ID}-{i}" for i in range(calls)]

    def block(r: int) -> float:
        start = time.perf_counter()
        for order_id in orders:
            function(order_id)
        return time.perf_counter() - start

    return block


def core_block(tool: Tool, ledger: Ledger, calls: int, tag: str) -> Block:
    protected = replay_safe(ledger=ledger, name="refund")(tool.function)
    orders = [f"{ORDER_ID}-{i}" for i in range(calls)]

    def block(r: int) -> float:
        ids = [(f"{tag}{r}-{i}-{next(_fresh)}", order_id) for i, order_id in enumerate(orders)]
        before = tool.runs
        start = time.perf_counter()
        for message_id, order_id in ids:
            with tool_call(THREAD, message_id, "c"):
                protected(order_id)
        elapsed = time.perf_counter() - start
        assert tool.runs - before == calls, f"the protected function ran {tool.runs - before} times, not {calls}"
        return elapsed

    return block


@contextlib.contextmanager
def postgres_ledger(spec: dict[str, Any]) -> Iterator[tuple[Ledger | None, str]]:
    """A ``PostgresLedger`` in the spec's schema (made here, dropped after), or why there is none."""
    if not spec.get("ledger_url"):
        yield None, "not measured: no postgres server answered"
        return
    try:
        psycopg = importlib.import_module("psycopg")
        from replaysafe import PostgresLedger
    except ImportError as exc:
        yield None, f"not measured: no PostgreSQL driver in this environment ({exc})"
        return
    schema = spec["schema"]
    with psycopg.connect(spec["dsn"], autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    ledger = None
    try:
        ledger = PostgresLedger(spec["ledger_url"], schema=schema)
        yield ledger, ""
    finally:
        if ledger is not None:
            ledger.close()
        with psycopg.connect(spec["dsn"], autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    harness, framework, adapter = FRAMEWORKS[spec["adapter"]]
    calls = spec["calls"]
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    tool = Tool()
    build = harness(tool, calls, loop)
    skipped: dict[str, str] = {}
    try:
        with postgres_ledger(spec) as (postgres, why):
            ledgers: dict[str, Ledger] = {"memory": MemoryLedger()}
            if postgres is not None:
                ledgers["postgres"] = postgres
            else:
                skipped["postgres"] = why
            blocks: dict[str, Block] = {
                "framework": agent_block(build(None), tool, calls),
                "core.bare": bare_block(tool, calls),
            }
            for name, ledger in ledgers.items():
                blocks[f"adapter.{name}"] = agent_block(build(ledger), tool, calls)
                blocks[f"core.{name}"] = core_block(tool, ledger, calls, f"core-{name}-")
            per_call = paired_rounds(blocks, rounds=spec["rounds"], calls=calls, warmup=spec["warmup"])
    finally:
        loop.close()
    import replaysafe

    return {
        "per_call_s": per_call,
        "skipped": skipped,
        "framework": f"{framework} {importlib.metadata.version(framework)}",
        "adapter_version": importlib.metadata.version(adapter),
        "python": platform.python_version(),
        "replaysafe_path": os.path.dirname(replaysafe.__file__),
    }


def main() -> None:
    print(json.dumps(measure(json.loads(sys.argv[1]))))


if __name__ == "__main__":
    main()
