"""core/heap.py: start-up's objects leave the collector's passes (in a child process: GC state is global)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import gc, json, weakref
import kafka_eventing.dispatcher.__main__  # what a dispatcher has imported by the time it freezes
from kafka_eventing.core.heap import GEN0_THRESHOLD, freeze_startup_heap
class Node:
    pass
garbage = Node()
garbage.me = garbage  # a cycle only the collector frees
alive = weakref.ref(garbage)
del garbage
before = gc.get_freeze_count()
freeze_startup_heap()
print(json.dumps([before, gc.get_freeze_count(), gc.get_threshold()[0] == GEN0_THRESHOLD, alive() is None]))
"""


def test_freeze_moves_the_startup_heap_out_of_collections_and_frees_its_garbage_first() -> None:
    import json

    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=60)
    before, frozen, threshold_set, garbage_freed = json.loads(out.stdout)
    assert before == 0
    assert frozen > 10_000  # the imported modules' objects
    assert threshold_set
    assert garbage_freed  # the cycle was collected before the freeze, not frozen with the rest
