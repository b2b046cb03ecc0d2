"""Idempotency keys are the same in every process: a provider dedupes a retry made by another process.

Each key is computed in separate interpreters with different hash seeds (which reorder
sets of strings and change ``hash()``), and compared; different calls must differ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import replaysafe

ROOT = Path(__file__).parents[1]

#: Run in a fresh interpreter: the keys of a few calls, as JSON. Parts include a frozenset
#: of strings, whose iteration order follows the hash seed.
KEYS_OF_CALLS = """
import json, uuid
import replaysafe
from replaysafe import current_call, replay_safe, tool_call

seen = {}

@replay_safe(ledger=replaysafe.MemoryLedger())
def refund_order(order_id: str, amount: float) -> str:
    info = current_call()
    seen[(info.thread_id, info.message_id, info.tool_call_id)] = info.idempotency_key
    return "ok"

@replay_safe(ledger=replaysafe.MemoryLedger())
def send_invoice(order_id: str, amount: float) -> str:
    seen[("send_invoice",)] = current_call().idempotency_key
    return "ok"

for ids in [("thread-1", "msg_1", "call_1"), ("thread-1", "msg_1", "call_2"), ("thread-2", "msg_1", "call_1")]:
    with tool_call(*ids):
        refund_order("1042", 59.0)
with tool_call("thread-1", "msg_1", "call_1"):
    send_invoice("1042", 59.0)
parts = [
    ("order-1042", 59, uuid.UUID("12345678-1234-5678-1234-567812345678")),
    ("order-1042", frozenset({"refund", "email", "ticket", "invoice", "sms", "push"})),
    ("order-1043", 59, uuid.UUID("12345678-1234-5678-1234-567812345678")),
]
print(json.dumps({
    "calls": {"/".join(k): v for k, v in seen.items()},
    "keys": [replaysafe.idempotency_key(*p, namespace="refunds") for p in parts],
    "hash": hash("order-1042"),
}))
"""


def keys_in_a_new_process(hash_seed: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-c", KEYS_OF_CALLS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, object] = json.loads(done.stdout)
    return found


def test_idempotency_keys_agree_across_processes() -> None:
    """current_call().idempotency_key and idempotency_key() are equal in two processes with other hash seeds."""
    first, second = keys_in_a_new_process("1"), keys_in_a_new_process("2")
    assert first["hash"] != second["hash"]  # the seeds really differ, so sets iterate in other orders
    assert first["calls"] == second["calls"]
    assert first["keys"] == second["keys"]
    calls, keys = first["calls"], first["keys"]
    assert isinstance(calls, dict) and isinstance(keys, list)
    # Different calls (another tool call id, thread or tool) and different parts give different keys.
    assert len(set(calls.values())) == len(calls) == 4
    assert len(set(keys)) == len(keys) == 3
    # Keys handed to providers must also survive an upgrade: two are pinned.
    assert calls["thread-1/msg_1/call_1"] == "rs-4a0c16be081c1ece13f5d881b0aba69b0f9fc6c0"
    assert replaysafe.idempotency_key("order-1042", 59, namespace="refunds") == (
        "rs-6b4dc3b135b76b5be3cbe590cec2ff09d7aa0dd7"
    )
