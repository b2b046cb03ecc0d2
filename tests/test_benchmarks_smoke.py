"""``python -m benchmarks --quick`` runs and writes its results. Nothing here asserts a time or a ratio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("meta", "overhead", "floor", "alternative", "concurrency", "scale", "parallel", "targets")


@pytest.mark.slow
def test_quick_benchmark_writes_markdown_json_and_chart(
    tmp_path: Path, postgres_server_url: str, redis_server_url: str
) -> None:
    """The smoke run finishes, and writes a markdown report, a JSON file with every section and a PNG chart."""
    env = {
        **os.environ,
        "REPLAYSAFE_TEST_POSTGRES_URL": postgres_server_url,
        "REPLAYSAFE_TEST_REDIS_URL": redis_server_url,
    }
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    written = {path.suffix: path for path in tmp_path.iterdir()}
    assert set(written) == {".md", ".json", ".png"}, sorted(tmp_path.iterdir())
    results = json.loads(written[".json"].read_text())
    assert set(SECTIONS) <= set(results)
    for section in ("overhead", "concurrency", "scale", "parallel"):
        skipped = [name for name, data in results[section].items() if isinstance(data, dict) and "skipped" in data]
        assert not skipped, f"{section}: {skipped} were skipped"
    assert {"memory", "redis"} <= set(results["alternative"]), "the Powertools comparison did not run"
    assert results["targets"] and all(row["met"] is not None for row in results["targets"])
    assert "## Targets" in written[".md"].read_text()
    assert written[".png"].read_bytes().startswith(b"\x89PNG")
