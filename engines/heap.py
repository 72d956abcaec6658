"""The process heap's permanent generation: frozen once start-up is done, thawed for good when
something made before the freeze is dropped.

`freeze()` (gateway start-up, once every model is loaded) runs one full collection and then
`gc.freeze()`, so the collector's full passes under load stop walking modules, tokenizers, model
objects and the router's tables. A cycle that passes through a frozen object is never collected,
though: an engine restarted after its generation loop died (whose traceback holds the loop's
frame, its batch and its KV cache) or a classic model unloaded would then stay in memory next to
its replacement. So whatever drops start-up's objects calls `thaw()` first, and the heap stays
unfrozen from then on: correctness first, the speed-up only until the first restart or unload.
"""

from __future__ import annotations

import gc
import logging
import threading

log = logging.getLogger("sluice.heap")
_lock = threading.Lock()
_frozen = False


def freeze() -> None:
    global _frozen
    with _lock:
        gc.collect()
        gc.freeze()
        _frozen = True
    log.debug("gc: %d objects frozen", gc.get_freeze_count())


def thaw() -> None:
    """Give every frozen object back to the collector (idempotent; a no-op if nothing was frozen)."""
    global _frozen
    with _lock:
        if _frozen:
            gc.unfreeze()
            _frozen = False
            log.info("gc: heap unfrozen (an engine or model made at start-up is being replaced or dropped)")


def frozen() -> bool:
    return _frozen
