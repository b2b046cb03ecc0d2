"""The public API type-checks: the README's main pattern under mypy --strict and pyright, and a 100% score."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mypy import api as mypy_api

MAIN_PATTERN = """
from replaysafe import SqliteLedger, current_call, current_call_or_none, replay_safe, tool_call

ledger = SqliteLedger("ledger.db")


@replay_safe(ledger=ledger)
def refund_order(order_id: str, amount: float) -> str:
    key: str = current_call().idempotency_key
    return f"{order_id} {amount} {key}"


def maybe_key() -> str | None:
    call = current_call_or_none()
    return None if call is None else call.idempotency_key


with tool_call(thread_id="t1", message_id="msg_7", tool_call_id="call_1"):
    result: str = refund_order("o-1", 59.0)
"""

#: The httpx hooks take any request with a ``method`` and mutable ``headers`` (a Protocol of replaysafe's own,
#: so their signatures do not hang on httpx's partially annotated ``Request``): an ``httpx.Request`` is one.
HTTP_PATTERN = """
import httpx

from replaysafe.http import aadd_idempotency_key, add_idempotency_key

client = httpx.Client(event_hooks={"request": [add_idempotency_key]})
aclient = httpx.AsyncClient(event_hooks={"request": [aadd_idempotency_key]})
add_idempotency_key(httpx.Request("POST", "https://api.example.com/refunds"))
"""
PATTERNS = {"main": MAIN_PATTERN, "http": HTTP_PATTERN}


def _pyright() -> list[str]:
    found = shutil.which("pyright", path=str(Path(sys.executable).parent))
    assert found, "pyright is declared in the lint extra: pip install -r requirements-dev.txt"
    return [found]


def _pyright_env() -> dict[str, str]:
    # verifytypes finds the package through the first `python` on PATH: this environment's.
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_main_pattern_passes_mypy_strict(pattern: str, tmp_path: Path) -> None:
    source = tmp_path / "main_pattern.py"
    source.write_text(PATTERNS[pattern], encoding="utf-8")
    out, err, status = mypy_api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(source)]
    )
    assert status == 0, out + err


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_main_pattern_passes_pyright_strict(pattern: str, tmp_path: Path) -> None:
    source = tmp_path / "main_pattern.py"
    source.write_text("# pyright: strict\n" + PATTERNS[pattern], encoding="utf-8")
    done = subprocess.run(
        [*_pyright(), "--outputjson", str(source)],
        capture_output=True,
        text=True,
        env=_pyright_env(),
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    report = json.loads(done.stdout)
    assert report["summary"]["errorCount"] == 0, json.dumps(report["generalDiagnostics"], indent=1)


def test_every_public_symbol_has_a_known_type(tmp_path: Path) -> None:
    """pyright --verifytypes: 100%, types from other packages aside.

    Without ``--ignoreexternal`` the score is below 100% only through other packages' own incomplete types that
    the public API hands out or takes as they are: SQLAlchemy's ``Engine``, ``AsyncEngine``, ``URL`` and
    ``Dialect`` (the SQL ledgers' ``engine`` and arguments), redis-py's ``Redis`` and ``RedisCluster`` (sync and
    asyncio: ``RedisLedger``'s client), requests' ``HTTPAdapter`` (the base of ``IdempotencyKeyAdapter``, whose
    ``send`` takes a ``PreparedRequest`` and returns a ``Response``) and pytest's ``FixtureFunctionDefinition``
    (the plugin's fixtures). Replacing them by Protocols of our own would take precision from users.
    """
    done = subprocess.run(
        [*_pyright(), "--verifytypes", "replaysafe", "--ignoreexternal", "--outputjson"],
        capture_output=True,
        text=True,
        env=_pyright_env(),
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    report = json.loads(done.stdout)
    completeness = report["typeCompleteness"]
    problems = [
        f"{symbol['name']}: {diagnostic['message']}"
        for symbol in completeness["symbols"]
        for diagnostic in symbol.get("diagnostics", [])
        if diagnostic["severity"] == "error"
    ]
    assert completeness["packageRootDirectory"].endswith("replaysafe")
    assert completeness["completenessScore"] == 1.0, "\n".join(problems)
