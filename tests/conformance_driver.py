"""The conformance kit's reference driver: a hand-written agent loop over ``replay_safe`` and ``tool_call``.

The loop keeps its conversation in a JSON file, saved once each turn's tools have run (the model's
response is not saved before them: a crash mid-turn asks the model again, which is what makes the
re-plan scenario possible). Its "adapter" is ``@replay_safe`` with the model's ids under ``tool_call``.

It is a small framework too: it asks its human (``AgentRun.approver``) before it calls a tool that
``needs_approval``, keeps the answer in its own file (written before the tool runs, as a framework keeps
its approval state), and hands a tool's error to the model as its answer. Its adapter records the human's
answer as a bound approval (``replaysafe.approvals``), and a call that asks for a new decision (in doubt
after it ran on one) ends the run waiting, as the framework's own pending approval.
"""

from __future__ import annotations

import json
from typing import Any

from replaysafe import CONTROL_ERRORS, ApprovalRequiredError, approvals, replay_safe, tool_call
from replaysafe.testing.conformance import AgentRun


class _Waiting(Exception):
    """The run stops here: a tool call waits for its human's answer."""


class _Paused(Exception):
    """The loop's pause: a tool waits for its human (``LoopDriver.ask``)."""


class LoopDriver:
    offers = frozenset({"approvals", "pauses", "tool_errors"})

    def __init__(self) -> None:
        self._asking = ""  # the call whose tool is running (one at a time)

    def ask(self, run: AgentRun, question: str) -> str:
        """A tool waits for its human: the answer the loop kept for this call, else the loop pauses the call."""
        answers = self._answers(run)
        if self._asking in answers:
            return answers[self._asking]
        raise _Paused(question)

    @staticmethod
    def _answers(run: AgentRun) -> dict[str, str]:
        path = run.folder / "answers.json"
        answers: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
        return answers

    def run(self, run: AgentRun) -> None:
        path = run.folder / "history.json"
        history: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
        while True:
            turn = len(history)
            answer = run.script.turn(turn)
            if isinstance(answer, str):
                return
            message_id, call_ids = run.script.ids("openai-chat", turn, run.boot)
            results = {}
            try:
                for call_id, call in zip(call_ids, answer, strict=True):
                    results[call_id] = self._call(run, message_id, call_id, call.tool, dict(call.args))
            except _Waiting:
                return  # the framework keeps the turn pending until its human answers
            history.append({"message_id": message_id, "results": results})
            path.write_text(json.dumps(history))

    def _call(self, run: AgentRun, message_id: str, call_id: str, name: str, args: dict[str, Any]) -> Any:
        tool = run.tools[name]
        options = dict(run.options)
        needs_approval = bool(options.get("needs_approval"))
        if not run.protect:
            options.pop("needs_approval", None)
        protected = replay_safe(ledger=run.ledger, name=name, **options)(tool) if run.protect else tool
        key = (run.thread_id, message_id, call_id)
        if needs_approval:
            self._approved(run, key, protected, args)
        self._asking = call_id
        try:
            if not run.protect:
                return tool(**args)
            with tool_call(*key, pauses=(_Paused,)):
                return protected(**args)
        except _Paused:
            # The framework asks its human, keeps the answer, and runs the tool again from its top.
            answers = self._answers(run)
            answers[call_id] = run.answer
            (run.folder / "answers.json").write_text(json.dumps(answers))
            return self._call(run, message_id, call_id, name, args)
        except ApprovalRequiredError:
            raise _Waiting from None  # asked again (in doubt after it ran on its approval): for a new decision
        except CONTROL_ERRORS:
            raise  # replaysafe's own refusals stop the run
        except Exception as exc:  # the model reads the tool's error, as a framework hands it over
            return {"error": type(exc).__name__}

    def _approved(self, run: AgentRun, key: tuple[str, str, str], protected: Any, args: dict[str, Any]) -> None:
        """The framework's approval flow: the answer it kept, else its human's, kept before the tool runs."""
        path = run.folder / "approvals.json"
        answered: list[str] = json.loads(path.read_text()) if path.exists() else []
        if key[2] in answered:
            return
        if run.approver is None:
            raise _Waiting
        if run.protect:  # the adapter: the human's answer becomes an approval bound to this call
            approvals.request(key, tool=protected, args=args, ledger=run.ledger)
            approvals.approve(key, by=run.approver, ledger=run.ledger)
        path.write_text(json.dumps([*answered, key[2]]))


DRIVER = LoopDriver()


class UnprotectedDriver(LoopDriver):
    """An adapter that forgets to protect: the tools run plain whatever ``protect`` says."""

    def run(self, run: AgentRun) -> None:
        super().run(
            AgentRun(
                run.script,
                run.tools,
                run.folder,
                run.ledger,
                False,
                run.options,
                run.boot,
                approver=run.approver,
                answer=run.answer,
            )
        )


UNPROTECTED = UnprotectedDriver()
