"""Timezone-aware UTC time, in one place (tests freeze it with freezegun)."""

from __future__ import annotations

from datetime import datetime, timezone


def utcnow() -> datetime:
    return datetime.now(timezone.utc)
