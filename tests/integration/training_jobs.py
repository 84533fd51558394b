"""Training functions the integration tests submit by entry (the workers import them by name)."""

from __future__ import annotations


def crash(config: dict) -> None:
    raise RuntimeError(f"this job crashes on purpose ({config.get('why', 'test')})")
