"""The collector's settings `serve` and its projector process run with (interfaces/runtime.py)."""

from __future__ import annotations

import gc

from interfaces.runtime import MIDDLE, OLD, YOUNG, tune_gc


def test_start_up_objects_are_frozen_and_the_young_generation_waits_longer():
    before = gc.get_threshold()
    kept = [object() for _ in range(10)]
    try:
        tune_gc()
        assert gc.get_threshold() == (YOUNG, MIDDLE, OLD)
        assert gc.get_freeze_count() > len(kept)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
