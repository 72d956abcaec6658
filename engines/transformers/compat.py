"""Every use of transformers' private continuous-batching internals, in one place.

The public API of `ContinuousBatchingManager` (`init_continuous_batching`, `start`,
`add_request`, `register_result_handler`, `cancel_request`, `stop`, `is_running`)
covers submitting, streaming and cancelling. What the transformers engine needs beyond
that (seeded sampling, batch sizes, a sink for late outputs) is met by touching these
internals, here and nowhere else:

- `ContinuousBatchingManager.logit_processor`, a `ContinuousBatchingLogitsProcessorList`:
  its `logits_processor` list, `tensors_required`, `supported_keys` and `do_processing`.
  Appending there (before `start()` sizes the argument buffers) is the only way to add a
  per-request logits processor, which seeded sampling is. `ContinuousBatchingLogitsProcessor`
  (an ABC in a private module) is told to treat the sampler as one of its own.
- `FutureRequestState.state`, a `RequestState`: its `logit_processor_kwargs` (where the
  request's seed travels) and `generated_tokens` (the step to seed with).
- `ContinuousBatchingManager._create_batch_processor` and the processor's
  `scheduler.schedule_batch`: wrapped to record the largest batch scheduled, which
  makes batching observable (`EngineStats.max_batch_size_seen`).
- `ContinuousBatchingManager.output_router`, an `OutputRouter`: its `_lock` and
  `result_handlers`. A handler is removed by the manager only on a finished output,
  which a cancelled request may never produce; without swapping it for a sink and
  dropping it later, late outputs would pile up in the shared output queue.

These were read from transformers 5.24.0. `check_version` refuses a transformers outside
the tested range, and `missing_internals` names whatever has moved (its test runs it on the
installed transformers, so an upgrade fails there, loudly, before it fails in production).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import ContinuousBatchingManager
    from transformers.generation.continuous_batching.continuous_api import ContinuousBatchProcessor
    from transformers.generation.continuous_batching.requests import FutureRequestState, GenerationOutput

TESTED_RANGE = ">=5.24,<5.25"


def check_version(installed: str | None = None) -> None:
    """Raise RuntimeError unless the installed transformers (or `installed`) is in the tested range."""
    from packaging.specifiers import SpecifierSet

    found = installed if installed is not None else version("transformers")
    if found not in SpecifierSet(TESTED_RANGE):
        raise RuntimeError(
            f"the transformers engine is tested with transformers {TESTED_RANGE}, but {found} is installed; "
            "it relies on continuous-batching internals that change between releases "
            "(install the version pinned in requirements.txt)"
        )


_PACKAGE = "transformers.generation.continuous_batching"

# (module under _PACKAGE, class) -> attributes declared on the class (methods, annotated fields, slots).
_CLASS_ATTRS: dict[tuple[str, str], tuple[str, ...]] = {
    ("continuous_api", "ContinuousBatchingManager"): ("_create_batch_processor",),
    ("continuous_api", "ContinuousBatchProcessor"): ("scheduler",),
    ("scheduler", "Scheduler"): ("schedule_batch",),
    ("cb_logits_processors", "ContinuousBatchingLogitsProcessor"): ("register",),
    ("requests", "FutureRequestState"): ("state",),
    ("requests", "RequestState"): ("logit_processor_kwargs", "generated_tokens"),
}
# class -> attributes its __init__ sets.
_INSTANCE_ATTRS: dict[str, tuple[str, ...]] = {
    "ContinuousBatchingManager": ("logit_processor", "output_router"),
    "OutputRouter": ("_lock", "result_handlers"),
    "ContinuousBatchingLogitsProcessorList": ("logits_processor", "tensors_required", "supported_keys",
                                              "do_processing"),
}


def missing_internals(manager: ContinuousBatchingManager | None = None) -> list[str]:
    """The internals this module relies on that the installed transformers lacks (empty when all are there).

    Without a manager, instance attributes are checked on objects that need no model.
    """
    import importlib

    missing: list[str] = []
    for (module_name, cls_name), attrs in _CLASS_ATTRS.items():
        try:
            cls = getattr(importlib.import_module(f"{_PACKAGE}.{module_name}"), cls_name)
        except (ImportError, AttributeError):
            missing.append(f"{_PACKAGE}.{module_name}.{cls_name}")
            continue
        missing += [f"{cls_name}.{a}" for a in attrs if not _declared(cls, a)]
    for cls_name, obj in _instances(manager).items():
        missing += [f"{cls_name}.{a}" for a in _INSTANCE_ATTRS[cls_name] if not hasattr(obj, a)]
    return missing


def _declared(cls: type, name: str) -> bool:
    return hasattr(cls, name) or name in getattr(cls, "__annotations__", {}) or name in getattr(cls, "__slots__", ())


def _instances(manager: ContinuousBatchingManager | None) -> dict[str, object]:
    if manager is not None:
        return {"ContinuousBatchingManager": manager, "OutputRouter": getattr(manager, "output_router", None),
                "ContinuousBatchingLogitsProcessorList": getattr(manager, "logit_processor", None)}
    from transformers import LogitsProcessorList
    from transformers.generation.continuous_batching.cb_logits_processors import (
        ContinuousBatchingLogitsProcessorList,
    )
    from transformers.generation.continuous_batching.continuous_api import OutputRouter

    return {"OutputRouter": OutputRouter(),
            "ContinuousBatchingLogitsProcessorList": ContinuousBatchingLogitsProcessorList(LogitsProcessorList())}


def require_internals(manager: ContinuousBatchingManager) -> None:
    """Raise RuntimeError naming each internal the installed transformers lacks."""
    missing = missing_internals(manager)
    if missing:
        raise RuntimeError(f"transformers {version('transformers')} lacks internals the transformers engine "
                           f"relies on (tested with {TESTED_RANGE}): {', '.join(missing)}")


def add_logits_processor(manager: ContinuousBatchingManager, processor: Any, kwargs: Mapping[str, type]) -> None:
    """Append a per-request processor (one int32 argument per row) to the manager's chain.

    Must run before `start()`, which sizes the argument buffers from `tensors_required`.
    """
    from transformers.generation.continuous_batching.cb_logits_processors import ContinuousBatchingLogitsProcessor

    ContinuousBatchingLogitsProcessor.register(type(processor))
    plist = manager.logit_processor
    plist.logits_processor.append(processor)
    plist.tensors_required += 1
    plist.supported_keys.update(kwargs)
    plist.do_processing = True


def request_kwargs(request: FutureRequestState) -> dict[str, Any]:
    """The extra `add_request` keyword arguments of a request in the batch."""
    kwargs: dict[str, Any] = request.state.logit_processor_kwargs
    return kwargs


def generated_count(request: FutureRequestState) -> int:
    """Tokens the request has generated so far."""
    return len(request.state.generated_tokens)


def watch_batch_sizes(manager: ContinuousBatchingManager, record: Callable[[int], None]) -> None:
    """Call `record(size)` with the size of every non-empty batch the manager schedules."""
    original = type(manager)._create_batch_processor

    def create(self_: ContinuousBatchingManager) -> ContinuousBatchProcessor:
        processor = original(self_)
        schedule = processor.scheduler.schedule_batch

        def schedule_batch(token_budget: int, cache_budget: int) -> Any:
            result = schedule(token_budget, cache_budget)
            if result[0]:
                record(len(result[0]))
            return result

        processor.scheduler.schedule_batch = schedule_batch  # type: ignore[method-assign]
        return processor

    # Bound to this manager only: other managers in the process are unaffected.
    manager._create_batch_processor = create.__get__(manager)  # type: ignore[method-assign]


def _discard(_output: GenerationOutput) -> None:
    pass


def sink_result_handler(manager: ContinuousBatchingManager, request_id: str) -> None:
    """Swap a request's result handler for one that drops outputs, keeping it registered."""
    router = manager.output_router
    with router._lock:
        entry = router.result_handlers.get(request_id)
        if entry is not None:
            router.result_handlers[request_id] = (_discard, entry[1])


def drop_result_handler(manager: ContinuousBatchingManager, request_id: str) -> None:
    router = manager.output_router
    with router._lock:
        router.result_handlers.pop(request_id, None)
