"""The public API type-checks: the README's main pattern under mypy --strict and pyright, and a 100% score."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def _pyright() -> list[str]:
    found = shutil.which("pyright", path=str(Path(sys.executable).parent))
    assert found, "pyright is declared in the lint extra: pip install -r requirements-dev.txt"
    return [found]


def _pyright_env() -> dict[str, str]:
    # verifytypes finds the package through the first `python` on PATH: this environment's.
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_the_main_pattern_passes_mypy_strict(tmp_path: Path) -> None:
    source = tmp_path / "main_pattern.py"
    source.write_text(MAIN_PATTERN, encoding="utf-8")
    out, err, status = mypy_api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(source)]
    )
    assert status == 0, out + err


def test_the_main_pattern_passes_pyright_strict(tmp_path: Path) -> None:
    source = tmp_path / "main_pattern.py"
    source.write_text("# pyright: strict\n" + MAIN_PATTERN, encoding="utf-8")
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
    """pyright --verifytypes: 100%, types from other packages aside (SQLAlchemy's and redis-py's are theirs)."""
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
