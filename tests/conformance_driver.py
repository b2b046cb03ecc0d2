"""The conformance kit's reference driver: a hand-written agent loop over ``replay_safe`` and ``tool_call``.

The loop keeps its conversation in a JSON file, saved once each turn's tools have run (the model's
response is not saved before them: a crash mid-turn asks the model again, which is what makes the
re-plan scenario possible). Its "adapter" is ``@replay_safe`` with the model's ids under ``tool_call``.

It is a small framework too: it asks its human (``AgentRun.approver``) before it calls a tool that
``needs_approval``, keeps the answer in its own file before anything else (approve, approve with an edit,
or reject), by the call's place in the turn as LangGraph keys an interrupt's answer by its place in the
graph, and applies it there on every run: an edit is run in place of the model's arguments, a rejection
is answered to the model. It hands a tool's error to the model as its answer.

Its adapter records the kept answer as an approval bound to the call it was given for
(``replaysafe.approvals``), once, while the call waits for its first decision; a call that another
call's answer is handed to asks for its own. A call the adapter refuses (asked again for a new decision,
an approval expired or for other arguments) ends the run waiting, as the framework's own pending
approval.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any

from replaysafe import (
    CONTROL_ERRORS,
    ApprovalExpiredError,
    ApprovalRejectedError,
    ApprovalRequiredError,
    ReplayMismatchError,
    approvals,
    replay_safe,
    tool_call,
)
from replaysafe.testing.conformance import APPROVER, AgentRun


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
                for place, (call_id, call) in enumerate(zip(call_ids, answer, strict=True)):
                    key = (run.thread_id, message_id, call_id)
                    results[call_id] = self._call(run, key, f"{turn}.{place}", call.tool, dict(call.args))
            except _Waiting:
                return  # the framework keeps the turn pending until its human answers
            history.append({"message_id": message_id, "results": results})
            path.write_text(json.dumps(history))

    def _call(self, run: AgentRun, key: tuple[str, str, str], place: str, name: str, args: dict[str, Any]) -> Any:
        tool = run.tools[name]
        options = dict(run.options)
        needs_approval = bool(options.get("needs_approval"))
        if not run.protect:
            options.pop("needs_approval", None)
        protected = replay_safe(ledger=run.ledger, name=name, **options)(tool) if run.protect else tool
        if needs_approval:
            answer = self._answer(run, key, place, args)
            if run.protect:
                self._record(run, key, protected, args, answer)
            elif not answer["approve"]:
                return {"error": "rejected by its human"}  # the framework's own rejection
            elif answer["args"] is not None:
                args = dict(answer["args"])  # the framework's own edit
        self._asking = key[2]
        try:
            if not run.protect:
                return tool(**args)
            with tool_call(*key, pauses=(_Paused,)):
                return protected(**args)
        except _Paused:
            # The framework asks its human, keeps the answer, and runs the tool again from its top.
            answers = self._answers(run)
            answers[key[2]] = run.answer
            (run.folder / "answers.json").write_text(json.dumps(answers))
            return self._call(run, key, place, name, args)
        except ApprovalRejectedError:
            return {"error": "rejected by its human"}  # the rejection recorded, answered as the framework does
        except (ApprovalRequiredError, ReplayMismatchError, ApprovalExpiredError):
            # The adapter refused the answer it has (another call's, expired, spent, or for other arguments than
            # those approved or run under this key): nothing ran, and the call waits for a new decision.
            raise _Waiting from None
        except CONTROL_ERRORS:
            raise  # replaysafe's own other refusals stop the run
        except Exception as exc:  # the model reads the tool's error, as a framework hands it over
            return {"error": type(exc).__name__}

    @staticmethod
    def _answer(run: AgentRun, key: tuple[str, str, str], place: str, args: dict[str, Any]) -> dict[str, Any]:
        """The framework's approval flow: the answer it kept for the call's place, else its human's, kept
        (with the call it was given for) before anything else happens."""
        path = run.folder / "approvals.json"
        kept: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.exists() else {}
        if place not in kept:
            if run.approver is None:
                raise _Waiting
            decided = run.approval
            kept[place] = {"call": list(key), "asked": args, "approve": decided.approve, "args": decided.args}
            path.write_text(json.dumps(kept))
        return kept[place]

    @staticmethod
    def _record(
        run: AgentRun, key: tuple[str, str, str], protected: Any, args: dict[str, Any], answer: dict[str, Any]
    ) -> None:
        """The adapter: the kept answer, recorded as an approval bound to the call it was given for, once (while
        the call waits for its first decision). Another call's answer is not recorded: this call asks for its own."""
        if tuple(answer["call"]) != key:
            return
        state = approvals.state(key, ledger=run.ledger)
        if state is not None and not state.waiting:
            return  # decided already (the answer was recorded before a crash), or run on it
        # Asked with the arguments the human saw, not the call's: a call asked again with others is refused.
        approvals.request(key, tool=protected, args=answer["asked"], ledger=run.ledger)
        if answer["approve"]:
            expires = approvals.DEFAULT_EXPIRY if run.approval_expires_in is None else run.approval_expires_in
            approvals.approve(key, by=APPROVER, args=answer["args"], ledger=run.ledger, expires_in=expires)
        else:
            approvals.reject(key, by=APPROVER, reason="the human said no", ledger=run.ledger)


DRIVER = LoopDriver()


class UnprotectedDriver(LoopDriver):
    """An adapter that forgets to protect: the tools run plain whatever ``protect`` says."""

    def run(self, run: AgentRun) -> None:
        super().run(dataclasses.replace(run, protect=False))


UNPROTECTED = UnprotectedDriver()


class IdleResumeDriver(LoopDriver):
    """A wrong adapter whose resume does nothing: the work the crash cut short is never done."""

    def run(self, run: AgentRun) -> None:
        if run.boot == 0 or not run.protect:  # its control is the plain loop
            super().run(run)


IDLE_RESUME = IdleResumeDriver()


class AsksFirstDriver(LoopDriver):
    """A framework that keeps its human's answer only once the adapter has recorded the request (Strands and
    ADK ask from a hook that runs first): a run killed at that request's claim leaves no answer, and its resume,
    with nobody to answer, waits."""

    def _call(self, run: AgentRun, key: tuple[str, str, str], place: str, name: str, args: dict[str, Any]) -> Any:
        if run.protect and run.options.get("needs_approval") and not (run.folder / "approvals.json").exists():
            protected = replay_safe(ledger=run.ledger, name=name, **run.options)(run.tools[name])
            # Asked before with other arguments, or run: the call's claim says what happens.
            with contextlib.suppress(ValueError, ReplayMismatchError):
                approvals.request(key, tool=protected, args=args, ledger=run.ledger)
        return super()._call(run, key, place, name, args)


ASKS_FIRST = AsksFirstDriver()


class DeafDriver(LoopDriver):
    """A wrong adapter that keeps a tool's pause as its outcome: the tool never hears its human's yes."""

    def ask(self, run: AgentRun, question: str) -> str:
        return "" if run.protect else super().ask(run, question)


DEAF = DeafDriver()


class RejectionAsApprovalDriver(LoopDriver):
    """A framework whose own gate answers a rejected call (the tool never runs), and a wrong adapter that records
    the rejection as an approval: nothing runs twice, or at all, and the check fails all the same."""

    def _call(self, run: AgentRun, key: tuple[str, str, str], place: str, name: str, args: dict[str, Any]) -> Any:
        if run.protect and run.options.get("needs_approval"):
            answer = self._answer(run, key, place, args)
            if not answer["approve"]:
                protected = replay_safe(ledger=run.ledger, name=name, **run.options)(run.tools[name])
                self._record(run, key, protected, args, {**answer, "approve": True})
                return {"error": "rejected by its human"}
        return super()._call(run, key, place, name, args)


REJECTION_AS_APPROVAL = RejectionAsApprovalDriver()
