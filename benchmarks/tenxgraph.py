"""Section 7: against the tool ledger of 10xGraph's ``PgCheckpointer``, on the same PostgreSQL, async.

10xGraph needs Python 3.12, so the measurement (``benchmarks/tenxgraph_child.py``) runs in the
10xGraph adapter's own environment, ``integrations/tenxgraph/.venv312``, as a subprocess; this
module finds that environment (a full run builds it the way ``integrations/tenxgraph/run-tests``
does when it is missing; ``--quick`` never installs anything) and turns the child's per-round
times into the usual medians and per-round ratios. Without a Python 3.12 or the environment the
section says "not measured" and the run goes on.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._child import run_child
from ._env import Scratch, libpq_url
from ._stats import micros, ratios, summary
from .settings import Settings

ROOT = Path(__file__).resolve().parent.parent
ADAPTER = ROOT / "integrations" / "tenxgraph"
ENV = ADAPTER / ".venv312"
#: What 10xGraph takes a Redis for (its state cache); the tool ledger path never uses it.
LOCAL_REDIS = "redis://127.0.0.1:6379/0"
#: (label in the results, configuration of ours, configuration of theirs)
PAIRS = (("first_call", "ours.first_call", "theirs.first_call"), ("replay", "ours.replay", "theirs.replay"))


def _python312() -> str | None:
    """pyenv's newest 3.12, else a ``python3.12`` on PATH: the interpreter run-tests uses."""
    pyenv = shutil.which("pyenv")
    if pyenv:
        listed = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True, check=False).stdout
        versions = [v for v in listed.split() if v == "3.12" or v.startswith("3.12.")]
        if versions:
            root = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False).stdout.strip()
            newest = max(versions, key=lambda v: [int(part) for part in v.split(".")])
            candidate = Path(root) / "versions" / newest / "bin" / "python3.12"
            if candidate.is_file():
                return str(candidate)
    return shutil.which("python3.12")


def _usable(python: Path) -> bool:
    """10xgraph, asyncpg and psycopg are installed there (read from metadata: importing 10xGraph takes seconds)."""
    if not python.is_file():
        return False
    probe = "import importlib.metadata as m; m.version('10xgraph'); m.version('psycopg'); m.version('asyncpg')"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, cwd=ROOT, check=False, timeout=120)
    return done.returncode == 0


def environment(quick: bool, log: Callable[[str], None]) -> tuple[Path | None, str]:
    """The 3.12 interpreter to measure in, or why there is none. Only a full run builds the environment."""
    python = ENV / "bin" / "python"
    if _usable(python):
        return python, ""
    where = ENV.relative_to(ROOT)
    if quick:
        return None, f"not measured: no Python 3.12 / 10xgraph environment ({where}; --quick never builds it)"
    interpreter = _python312()
    if interpreter is None:
        return None, "not measured: no Python 3.12 / 10xgraph environment (no pyenv 3.12 or python3.12 on PATH)"
    log(f"tenxgraph: building {where} as integrations/tenxgraph/run-tests does (once)")
    try:
        subprocess.run([interpreter, "-m", "venv", str(ENV)], check=True, capture_output=True, timeout=300)
        subprocess.run(
            [str(ENV / "bin" / "pip"), "install", "-q", "-e", "../..", "-e", ".[test,lint]"],
            cwd=ADAPTER, check=True, capture_output=True, timeout=1200,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"not measured: no Python 3.12 / 10xgraph environment (building it failed: {type(exc).__name__})"
    if not _usable(python):
        return None, "not measured: no Python 3.12 / 10xgraph environment (built, but 10xgraph does not import)"
    return python, ""


def run(settings: Settings, scratch: Scratch, log: Callable[[str], None]) -> dict[str, Any]:
    """Ours and 10xGraph's, first call and replay, as ``first_call`` / ``replay`` with per-round ratios."""
    if scratch.postgres_url is None:
        return {"skipped": "not measured: no postgres server answered"}
    python, why = environment(settings.quick, log)
    if python is None:
        log(f"tenxgraph: {why}")
        return {"skipped": why}
    log("tenxgraph: PgCheckpointer (Python 3.12 subprocess)")
    schema = f"{scratch.schema}_tenx"
    spec = {
        "schema": schema,
        "block": settings.tenxgraph_block,
        "rounds": settings.tenxgraph_rounds,
        "warmup": settings.warmup,
        "ledger_url": scratch.postgres_url,
        "dsn": libpq_url(scratch.postgres_url),
        "redis_url": scratch.redis_url or LOCAL_REDIS,
    }
    measured, why = run_child(
        python, "tenxgraph_child", spec, scratch, schema,
        what="the 10xGraph measurement", log=lambda message: log(f"tenxgraph: {message}"),
    )  # fmt: skip
    if measured is None:
        return {"skipped": why}
    per_call: dict[str, list[float]] = measured["per_call_s"]
    section: dict[str, Any] = {
        "version": measured["version"],
        "python": measured["python"],
        "rounds": settings.tenxgraph_rounds,
        "calls_per_block": settings.tenxgraph_block,
    }
    for label, ours, theirs in PAIRS:
        section[label] = {
            "ours_us": micros(per_call[ours]),
            "theirs_us": micros(per_call[theirs]),
            "ratio": summary(ratios(per_call, ours, theirs)),
        }
    return section
