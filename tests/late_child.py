"""A stand-alone worker for the late-result tests, run as ``python tests/late_child.py``.

``run LEDGER_URL THREAD FOLDER``: call ``refund_order("A1")`` under fixed ids; the tool writes
``FOLDER/started``, waits (bounded) until ``FOLDER/go`` exists, and returns ``"re_late"``. It prints its
result and the late result its ``on_late_result`` hook was handed, as JSON.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from replaysafe import LateResult, open_ledger, replay_safe, tool_call


def main(url: str, thread: str, folder: str) -> None:
    ledger = open_ledger(url)
    told: list[LateResult] = []
    here = Path(folder)

    @replay_safe(ledger=ledger, on_late_result=told.append)
    def refund_order(order_id: str) -> str:
        (here / "started").write_text("1")
        deadline = time.monotonic() + 60
        while not (here / "go").exists():  # the operator settles the call meanwhile
            if time.monotonic() > deadline:
                raise TimeoutError("never told to go on")
            time.sleep(0.02)
        return f"re_late_{order_id}"

    with tool_call(thread, "msg_1", "call_1"):
        result = refund_order("A1")
    late: dict[str, Any] | None = None
    if told:
        late = {
            "status": told[0].status.value,
            "result": told[0].result,
            "settled": None if told[0].settled is None else told[0].settled.status.value,
        }
    print(json.dumps({"result": result, "late": late}), flush=True)
    ledger.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
