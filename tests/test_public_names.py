"""The package's public face: its version, and the names its exceptions show in tracebacks."""

from __future__ import annotations

import pickle
import traceback
from pathlib import Path

import tomllib

import replaysafe
from replaysafe import CallInDoubtError, CallKey, ReplaySafeError, TamperedRecordError, UnprotectedCallWarning

ROOT = Path(__file__).parents[1]


def test_the_version_is_the_installed_distributions() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert replaysafe.__version__ == project["version"]


def test_public_exceptions_and_warnings_name_the_public_module() -> None:
    """A traceback says replaysafe.CallInDoubtError, not the private module that defines it; pickled errors still
    load (a worker process sends them back)."""
    exported = [getattr(replaysafe, name) for name in replaysafe.__all__]
    errors = [e for e in exported if isinstance(e, type) and issubclass(e, (ReplaySafeError, Warning))]
    assert CallInDoubtError in errors and UnprotectedCallWarning in errors
    assert [e for e in errors if e.__module__ != "replaysafe"] == []
    error = TamperedRecordError(
        "refund_order fails its seal check", key=CallKey("t", "m", "c"), tool_name="refund_order"
    )
    shown = "".join(traceback.format_exception_only(error))
    assert shown.startswith("replaysafe.TamperedRecordError: refund_order fails its seal check")
    assert type(pickle.loads(pickle.dumps(error))) is TamperedRecordError
