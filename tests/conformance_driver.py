"""The conformance kit's reference driver: a hand-written agent loop over ``replay_safe`` and ``tool_call``.

The loop keeps its conversation in a JSON file, saved once each turn's tools have run (the model's
response is not saved before them: a crash mid-turn asks the model again, which is what makes the
re-plan scenario possible). Its "adapter" is ``@replay_safe`` with the model's ids under ``tool_call``.
"""

from __future__ import annotations

import json
from typing import Any

from replaysafe import replay_safe, tool_call
from replaysafe.testing.conformance import AgentRun


class LoopDriver:
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
            for call_id, call in zip(call_ids, answer, strict=True):
                tool = run.tools[call.tool]
                if run.protect:
                    with tool_call(run.thread_id, message_id, call_id):
                        results[call_id] = replay_safe(ledger=run.ledger, name=call.tool, **run.options)(tool)(
                            **call.args
                        )
                else:
                    results[call_id] = tool(**call.args)
            history.append({"message_id": message_id, "results": results})
            path.write_text(json.dumps(history))


DRIVER = LoopDriver()


class UnprotectedDriver(LoopDriver):
    """An adapter that forgets to protect: the tools run plain whatever ``protect`` says."""

    def run(self, run: AgentRun) -> None:
        super().run(AgentRun(run.script, run.tools, run.folder, run.ledger, False, run.options, run.boot))


UNPROTECTED = UnprotectedDriver()
