"""The LLMs this gateway serves, by the id clients use."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engines.errors import ErrorKind, SluiceError
from engines.text.tokenizer import ChatTokenizer
from gateway.llm.admission import Admission, AdmissionConfig
from gateway.llm.admission.gate import Observer
from gateway.llm.capacity import DEFAULT_WORKER_CAPACITY
from gateway.llm.targets import Backend


def model_not_found(name: str) -> SluiceError:
    return SluiceError(f"The model `{name}` does not exist.", ErrorKind.NOT_FOUND, code="model_not_found",
                       param="model")


@dataclass(slots=True)
class LLMModel:
    name: str
    tokenizer: ChatTokenizer
    context_length: int
    backend: Backend
    admission: Admission
    owned_by: str = "sluice"
    root: str | None = None  # local weights directory, reported like vLLM's `root`
    created: int = field(default_factory=lambda: int(time.time()))


class ModelRegistry:
    """Models by id, plus the ids still loading (so a client gets 503, not 404)."""

    def __init__(self, admission: AdmissionConfig) -> None:
        self.admission = admission
        self.models: dict[str, LLMModel] = {}
        self.pending: set[str] = set()
        # Told of every model added and removed (the LLM layer starts and ends its per-model series).
        self.on_change: Callable[[str, bool], None] | None = None
        # Told when a model's capacity or admission limits change (its gauges follow).
        self.on_limits: Callable[[LLMModel], None] | None = None
        self.created: int | None = None  # every model's `created` (frontends agree on it); None: when added
        # A model's admission events (gateway.llm.admission.observe): per tenant and class series.
        self.observer_for: Callable[[str], Observer] | None = None

    def add(self, name: str, tokenizer: ChatTokenizer, context_length: int, backend: Backend,
            capacity: int = DEFAULT_WORKER_CAPACITY) -> LLMModel:
        model = LLMModel(name, tokenizer, context_length, backend, Admission(self.admission, capacity),
                         created=self.created or int(time.time()))
        if self.observer_for is not None:
            model.admission.observer = self.observer_for(name)
        self.models[name] = model
        self.pending.discard(name)
        if self.on_change is not None:
            self.on_change(name, True)
        if self.on_limits is not None:
            self.on_limits(model)
        return model

    def set_capacity(self, name: str, capacity: int) -> None:
        """The model's capacity now (its workers came, went, or changed health): limits follow live."""
        model = self.models.get(name)
        if model is None:
            return
        before = model.admission.capacity
        if (model.admission.set_capacity(capacity) or before != capacity) and self.on_limits is not None:
            self.on_limits(model)

    def remove(self, name: str) -> None:
        if self.models.pop(name, None) is not None and self.on_change is not None:
            self.on_change(name, False)

    def has(self, name: str) -> bool:
        return name in self.models

    def names(self) -> list[str]:
        return sorted(self.models)

    def get(self, name: str) -> LLMModel:
        """The model, or a domain error: MODEL_LOADING while it loads, NOT_FOUND otherwise."""
        model = self.models.get(name)
        if model is not None:
            return model
        if name in self.pending:
            raise SluiceError(f"The model `{name}` is still loading.", ErrorKind.MODEL_LOADING, param="model",
                              retry_after_s=5.0)
        raise model_not_found(name)

    def ready(self, strict: bool = True) -> bool:
        """Every model can serve; with `strict` False, every model this replica serves itself
        (a routed model with no healthy worker is down on every replica alike)."""
        return all(m.backend.ready() for m in self.models.values() if strict or not m.backend.shared)

    def readiness(self) -> dict[str, bool]:
        """Each model's state: can it serve now."""
        return {name: m.backend.ready() for name, m in self.models.items()}
