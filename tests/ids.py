"""Test ids that are the same in every process: pytest-xdist's workers must collect identical ids."""

from __future__ import annotations

from typing import Any


def stable_repr(value: Any) -> str:
    """``repr(value)``, with the members of a set in sorted order (a set's own order follows the hash seed)."""
    if isinstance(value, (set, frozenset)):
        inner = ", ".join(sorted(stable_repr(item) for item in value))
        if isinstance(value, frozenset):
            return f"frozenset({{{inner}}})"
        return f"{{{inner}}}" if value else "set()"
    if isinstance(value, tuple):
        return "(" + ", ".join(stable_repr(item) for item in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)
