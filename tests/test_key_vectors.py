"""The library against ``tests/key_vectors.json``: every key rule of docs/keys.md (rs1), derived from the
vectors' inputs, byte for byte. A difference is a format change: stored records and keys handed to
providers would no longer match (docs/keys.md says how a new version of the rules is added)."""

from __future__ import annotations

import decimal
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from replaysafe import ArgumentDigestError, CallInfo, CallKey, idempotency_key
from replaysafe._decorator import _qualified_name
from replaysafe._identity import SignatureDigest, _args_text, _canonical, args_digest, call_idempotency_key, key_digest
from replaysafe._keys import args_key, business_key, step_key
from replaysafe.http import request_idempotency_key

VECTORS: dict[str, Any] = json.loads((Path(__file__).parent / "key_vectors.json").read_text(encoding="utf-8"))


def value(encoded: Any) -> Any:
    """A vector's input: JSON, with ``{"$float": text}``, ``{"$decimal": text}`` and ``{"$tuple": [...]}`` for
    what JSON cannot tell apart (59.0 is a float, not the integer 59)."""
    if isinstance(encoded, dict):
        if encoded.keys() == {"$float"}:
            return float(encoded["$float"])
        if encoded.keys() == {"$decimal"}:
            return decimal.Decimal(encoded["$decimal"])
        if encoded.keys() == {"$tuple"}:
            return tuple(value(item) for item in encoded["$tuple"])
        return {name: value(item) for name, item in encoded.items()}
    if isinstance(encoded, list):
        return [value(item) for item in encoded]
    return encoded


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def cases(section: str) -> list[Any]:
    return [pytest.param(case, id=f"{section}-{n}") for n, case in enumerate(VECTORS[section])]


def test_the_vectors_are_rs1_and_cover_every_rule() -> None:
    assert VECTORS["spec"] == "rs1"
    sections = {name for name, cases in VECTORS.items() if isinstance(cases, list) and cases}
    assert sections == {
        "key_digest", "args_digest", "args_digest_rs0", "refused", "signature_digest", "tool_identity", "args_key",
        "business_key", "business_key_rs0", "step_key", "call_idempotency_key", "idempotency_key",
        "http_request_key", "mcp_meta_key",
    }  # fmt: skip


@pytest.mark.parametrize("case", cases("key_digest"))
def test_key_digest(case: dict[str, Any]) -> None:
    assert _canonical(case["ids"]) == case["text"]
    assert key_digest(*case["ids"]) == sha256(case["text"]) == case["digest"]


@pytest.mark.parametrize("case", cases("args_digest"))
def test_args_digest(case: dict[str, Any]) -> None:
    arguments = value(case["arguments"])
    assert _args_text(arguments) == case["text"]
    assert args_digest(arguments, tool_name="t") == sha256(case["text"]) == case["digest"]


@pytest.mark.parametrize("case", cases("args_digest_rs0"))
def test_args_digest_of_the_earlier_rules(case: dict[str, Any]) -> None:
    """rs0, as the earlier version wrote it (its records are looked up with it)."""
    assert args_digest(value(case["arguments"]), tool_name="t", rs0=True) == sha256(case["text"]) == case["digest"]


@pytest.mark.parametrize("case", cases("refused"))
def test_refused(case: dict[str, Any]) -> None:
    with pytest.raises(ArgumentDigestError):
        args_digest(value(case["arguments"]), tool_name="t")


@pytest.mark.parametrize("case", cases("signature_digest"))
def test_signature_digest(case: dict[str, Any]) -> None:
    """Excluded names and arguments equal to their default are left out."""
    digest = SignatureDigest(case["names"], case["exclude"], value(case["defaults"]))
    arguments = value(case["arguments"])
    assert digest(arguments, "t") == sha256(case["text"]) == case["digest"]
    positional = digest.of_positional(tuple(arguments[name] for name in case["names"]))
    assert positional in (None, case["digest"])


@pytest.mark.parametrize("case", cases("tool_identity"))
def test_tool_identity(case: dict[str, Any]) -> None:
    def tool() -> None: ...

    tool.__module__, tool.__qualname__ = case["module"], case["qualname"]
    assert (case["name"] or _qualified_name(tool)) == case["identity"]


@pytest.mark.parametrize("case", cases("args_key"))
def test_args_key(case: dict[str, Any]) -> None:
    digest = args_digest(value(case["arguments"]), tool_name="t")
    assert list(args_key(case["thread_id"], case["tool"], digest)) == case["key"]


@pytest.mark.parametrize("case", cases("business_key"))
def test_business_key(case: dict[str, Any]) -> None:
    assert list(business_key(case["tool"], value(case["value"]))) == case["key"]
    assert case["key"][2] == sha256(_args_text({"key": value(case["value"])}))


@pytest.mark.parametrize("case", cases("business_key_rs0"))
def test_business_key_of_the_earlier_rules(case: dict[str, Any]) -> None:
    assert list(business_key(case["tool_name"], value(case["value"]), rs0=True)) == case["key"]


@pytest.mark.parametrize("case", cases("step_key"))
def test_step_key(case: dict[str, Any]) -> None:
    assert list(step_key(CallKey(*case["parent"]), case["tool_name"], case["ordinal"])) == case["key"]


@pytest.mark.parametrize("case", cases("call_idempotency_key"))
def test_call_idempotency_key(case: dict[str, Any]) -> None:
    assert _canonical(["replaysafe.call", [*case["ids"], case["tool_name"]]]) == case["text"]
    thread_id, message_id, tool_call_id = case["ids"]
    key = call_idempotency_key(thread_id, message_id, tool_call_id, case["tool_name"])
    assert key == "rs-" + sha256(case["text"])[:40] == case["key"]


@pytest.mark.parametrize("case", cases("idempotency_key"))
def test_idempotency_key(case: dict[str, Any]) -> None:
    assert _canonical([case["namespace"], case["parts"]]) == case["text"]
    assert idempotency_key(*case["parts"], namespace=case["namespace"]) == "rs-" + sha256(case["text"])[:40]
    assert idempotency_key(*case["parts"], namespace=case["namespace"]) == case["key"]


def _call(ids: list[str], tool_name: str) -> CallInfo:
    thread_id, message_id, tool_call_id = ids
    return CallInfo(thread_id, message_id, tool_call_id, tool_name, 1)


@pytest.mark.parametrize("case", cases("http_request_key"))
def test_http_request_key(case: dict[str, Any]) -> None:
    assert request_idempotency_key(_call(case["ids"], case["tool_name"]), case["ordinal"]) == case["value"]


@pytest.mark.parametrize("case", cases("mcp_meta_key"))
def test_mcp_meta_key(case: dict[str, Any]) -> None:
    """The MCP client sends the call's idempotency key in ``_meta``; the server claims it under its own key."""
    key = _call(case["ids"], case["tool_name"]).idempotency_key
    assert case["meta"] == {"io.replaysafe/idempotency-key": key}
    assert case["server_key"][2] == key
