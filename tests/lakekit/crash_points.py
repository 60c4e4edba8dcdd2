"""In-process fault injection at the engine's named crash points."""

from __future__ import annotations

import compaction_assets.engine.run as engine_module


def on_crash_point(monkeypatch, point: str, action) -> None:
    """Run `action` once when the engine reaches `point` (the fault-injection seam, in-process)."""
    fired = []

    def hook(name: str) -> None:
        if name == point and not fired:
            fired.append(name)
            action()

    monkeypatch.setattr(engine_module, "crash_point", hook)
