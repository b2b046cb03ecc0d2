"""The MCP keys of docs/keys.md against tests/key_vectors.json: the client's ``_meta`` entry."""

from __future__ import annotations

import json
from pathlib import Path

from replaysafe import CallInfo
from replaysafe_mcp import META_KEY
from replaysafe_mcp._client import _with_key

VECTORS = json.loads((Path(__file__).parents[3] / "tests" / "key_vectors.json").read_text(encoding="utf-8"))


def test_the_client_sends_the_calls_key_under_the_spec_meta_entry() -> None:
    for case in VECTORS["mcp_meta_key"]:
        thread_id, message_id, tool_call_id = case["ids"]
        key = CallInfo(thread_id, message_id, tool_call_id, case["tool_name"], 1).idempotency_key
        assert _with_key(None, key) == case["meta"]
        assert _with_key({"progressToken": 1}, key) == {**case["meta"], "progressToken": 1}
        assert list(case["meta"]) == [META_KEY]
