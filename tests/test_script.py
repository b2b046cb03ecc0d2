"""``replaysafe.testing.Script``: the ids a scripted model answers with, in each provider's shape."""

from __future__ import annotations

import re

import pytest

from replaysafe.testing import Script, ScriptedCall, provider_id

SHAPES = {
    "openai-chat": (r"chatcmpl-[0-9A-Za-z]{29}", r"call_[0-9A-Za-z]{24}"),
    "openai-responses": (r"resp_[0-9a-f]{48}", r"call_[0-9A-Za-z]{24}"),
    "anthropic": (r"msg_01[0-9A-Za-z]{22}", r"toolu_01[0-9A-Za-z]{22}"),
    "bedrock": (r"msg_bdrk_01[0-9A-Za-z]{22}", r"tooluse_[0-9A-Za-z]{22}"),
    "gemini": (r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-a[0-9a-f]{3}-[0-9a-f]{12}",) * 2,
}
SCRIPT = Script((tuple(ScriptedCall("refund_order", {"order_id": o}) for o in ("A1", "B2")), "done"), name="s")


@pytest.mark.parametrize("style", sorted(SHAPES))
def test_ids_have_the_providers_shape_and_differ_per_turn_and_call(style: str) -> None:
    message, calls = SCRIPT.ids(style, 0)  # type: ignore[arg-type]
    message_shape, call_shape = SHAPES[style]
    assert re.fullmatch(message_shape, message) and all(re.fullmatch(call_shape, call) for call in calls)
    assert len(set(calls)) == 2 and SCRIPT.ids(style, 1)[0] != message  # type: ignore[arg-type]
    assert SCRIPT.ids(style, 1)[1] == []  # type: ignore[arg-type]  # the final answer calls nothing


def test_ids_are_the_same_after_a_restart_unless_the_script_replans() -> None:
    assert SCRIPT.ids("openai-chat", 0, boot=1) == SCRIPT.ids("openai-chat", 0, boot=0)
    replans = Script(SCRIPT.turns, name="s", new_ids_after_restart=True)
    assert replans.ids("openai-chat", 0, boot=1) != replans.ids("openai-chat", 0, boot=0)
    assert replans.ids("openai-chat", 0, boot=0) == SCRIPT.ids("openai-chat", 0)
    assert Script(SCRIPT.turns, name="other").ids("openai-chat", 0) != SCRIPT.ids("openai-chat", 0)


def test_after_the_last_turn_the_model_says_done() -> None:
    assert SCRIPT.turn(1) == "done" and SCRIPT.turn(7) == "done"
    assert provider_id("anthropic", "call", "x") == provider_id("anthropic", "call", "x")
