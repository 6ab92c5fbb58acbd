"""The garbage collector's settings for `serve` and its projector process (docs/adr/0031).

A delivery allocates thousands of container objects (the parsed body, headers, events, rows), so
CPython's default thresholds (700, 10, 10) run a young collection every few requests, and every
full collection walks everything alive: the imported modules and, in `serve`, the aggregate cache
(up to 50,000 aggregates). Measured on the ingest bench: the collector took ~5 % of the serving
process's CPU. Objects alive once start-up is done are frozen (never scanned again), and the young
generation is collected after `YOUNG` allocations instead of 700. Reference counting still frees
everything without a cycle at once; only cyclic garbage waits longer.
"""

from __future__ import annotations

import gc

YOUNG = 20_000  # container allocations (net) between collections of the youngest generation
MIDDLE = 20  # young collections between collections of the middle one
OLD = 50  # middle collections between full collections (CPython also waits for 25 % new objects)


def tune_gc() -> None:
    """Freezes what start-up left alive and sets the thresholds above (call once start-up is done)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, MIDDLE, OLD)
