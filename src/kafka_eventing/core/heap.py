"""The cyclic garbage collector's settings for the data-plane processes (receiver workers, dispatchers).

Both allocate many short-lived containers per event (requests, futures, headers). With Python's default
thresholds the collector runs every few events, and its oldest pass scans the whole heap left by start-up —
tens of thousands of imported objects: about 15 ms per pass in a dispatcher on a 2-core Xeon, enough to be an
open-loop p99 by itself, and ~8 % of a receiver worker's CPU in its profile (docs/receiver.md, docs/broker.md).
Once a process has started, ``freeze_startup_heap`` moves what exists into the permanent generation, which no
pass scans, and lets young passes run less often.
"""

from __future__ import annotations

import gc

#: Allocations (net of frees) between young passes; Python's default is 700.
GEN0_THRESHOLD = 20_000


def freeze_startup_heap() -> None:
    """Call once start-up is done (imports, clients built), before events flow."""
    gc.collect()  # what start-up left as garbage is freed rather than frozen
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, 20, 20)
