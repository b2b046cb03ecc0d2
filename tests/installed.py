"""A package installed for one test: a distribution's metadata and module on ``PYTHONPATH``, which is what
``pip install`` leaves and what ``importlib.metadata`` (entry points) discovers, in the test's own processes."""

from __future__ import annotations

import os
from pathlib import Path


def installed_package(site: Path, distribution: str, module: str, source: str, entry_points: str) -> dict[str, str]:
    """Install ``module`` (its ``source``) as the distribution ``distribution`` with ``entry_points`` (the
    ``entry_points.txt`` text) under ``site``; the environment of a process that has it installed."""
    info = site / f"{distribution.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    (site / f"{module}.py").write_text(source)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
