"""An offline chat model that plays a ``replaysafe.testing.Script``: crash-test a LangGraph agent without a
network or keys.

``scripted_chat_model(script)`` is a LangChain chat model (like langchain-core's ``GenericFakeChatModel``,
and it accepts ``bind_tools``) for ``create_agent`` or a model node of your own ``StateGraph``. It answers
turn ``n``, where ``n`` is the number of ``AIMessage``s in the conversation it is handed (its own earlier
answers), with that turn's tool calls or its final text: it keeps no state, so a process that resumes a
thread after a crash gets the answer the crashed one got. Each answer carries the ids a real provider
would give it (``Script.ids``): the ``AIMessage`` id (``chatcmpl-…`` in the default ``openai-chat``
style, ``msg_01…`` in the ``anthropic`` one) and each tool call's id (``call_…``, ``toolu_01…``), the ids
``replaysafe_langgraph`` keys a call by.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.tool import ToolCall
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import InstanceOf

from replaysafe.testing import IdStyle, Script

__all__ = ["ScriptedChatModel", "scripted_chat_model"]


class ScriptedChatModel(BaseChatModel):
    """A chat model that answers from a ``Script``, turn by turn, with a provider's ids.

    Build it with :func:`scripted_chat_model`. ``bind_tools`` returns a copy that knows the tools' names,
    and asking it for a tool the agent was not given raises ``ValueError`` (a script out of step with
    the agent), as a real provider refuses an unknown tool.
    """

    script: InstanceOf[Script]
    #: How many runs of the agent came before this one (0: the first; 1: the restart after a crash). It
    #: changes the ids only when the script says ``new_ids_after_restart`` (a model that re-plans).
    boot: int = 0
    #: The provider whose ids the answers carry.
    style: IdStyle = "openai-chat"
    #: The names of the tools bound with ``bind_tools`` (``None``: not bound, any name goes).
    tool_names: tuple[str, ...] | None = None

    @property
    def _llm_type(self) -> str:
        return "replaysafe-scripted"

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """This model, knowing the tools' names (``tool_choice`` and other options change nothing)."""
        names = tuple(str(convert_to_openai_tool(tool)["function"]["name"]) for tool in tools)
        return self.model_copy(update={"tool_names": names})

    def answer(self, messages: Sequence[BaseMessage]) -> AIMessage:
        """The answer to a conversation: the script's turn ``n``, ``n`` the ``AIMessage``s in ``messages``."""
        turn = sum(isinstance(message, AIMessage) for message in messages)
        planned = self.script.turn(turn)
        message_id, call_ids = self.script.ids(self.style, turn, self.boot)
        if isinstance(planned, str):
            return AIMessage(content=planned, id=message_id, response_metadata={"finish_reason": "stop"})
        calls: list[ToolCall] = []
        for call_id, call in zip(call_ids, planned, strict=True):
            if self.tool_names is not None and call.tool not in self.tool_names:
                raise ValueError(
                    f"the script {self.script.name!r} asks at turn {turn} for the tool {call.tool!r}, which the "
                    f"agent was not given (its tools: {', '.join(self.tool_names) or 'none'})"
                )
            calls.append(ToolCall(name=call.tool, args=dict(call.args), id=call_id, type="tool_call"))
        return AIMessage(content="", id=message_id, tool_calls=calls, response_metadata={"finish_reason": "tool_calls"})

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.answer(messages))])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._generate(messages)


def scripted_chat_model(script: Script, *, boot: int = 0, style: IdStyle = "openai-chat") -> ScriptedChatModel:
    """A LangChain chat model that plays ``script`` offline, for ``create_agent`` or a ``StateGraph``.

    ``boot`` counts the runs of the agent before this one on the same thread (0 for the first, 1 for the
    run that resumes after a crash): with ``Script(..., new_ids_after_restart=True)`` a model asked again
    after a restart answers under new ids, as a real one does. ``style`` picks the provider whose ids the
    answers carry (``"openai-chat"``, ``"anthropic"``, ...).
    """
    return ScriptedChatModel(script=script, boot=boot, style=style)
