"""A measurement run in another environment: ``python -m benchmarks.<module> '<spec as JSON>'`` as a subprocess.

Sections 7 and 9 measure in the environments of adapters whose frameworks cannot share the main one. The
child runs from the repository root with the root first on ``PYTHONPATH`` (so this package imports, and the
``replaysafe`` measured is this checkout's), and prints its results as one JSON object on its last line. The
PostgreSQL schema it works in is dropped afterwards here too, in case it died before it could.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from ._env import Scratch

ROOT = Path(__file__).resolve().parent.parent


def run_child(
    python: Path,
    module: str,
    spec: dict[str, Any],
    scratch: Scratch,
    schema: str,
    *,
    what: str,
    log: Callable[[str], None],
    timeout_s: int = 900,
) -> tuple[dict[str, Any] | None, str]:
    """The child's results, or ``None`` and why not ("not measured: ..."); ``what`` names it in that reason."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run(
            [str(python), "-m", f"benchmarks.{module}", json.dumps(spec)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None, f"not measured: {what} did not finish in {timeout_s} s"
    finally:
        drop_schema(scratch, schema)  # the child drops it; this covers a child that died first
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        log(f"the measurement failed: {done.stderr[-2000:]}")
        return None, f"not measured: {what} failed ({last[:200]})"
    return json.loads(done.stdout.strip().splitlines()[-1]), ""


def drop_schema(scratch: Scratch, schema: str) -> None:
    if scratch.postgres_url is None:
        return
    with contextlib.suppress(psycopg.Error), scratch.postgres_connect() as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
