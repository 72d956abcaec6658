"""`sim`: a modelled vLLM engine worker, for routing and overhead experiments at scale.

It is NOT an engine: it runs no model. It uses the model's tokenizer, draws output
tokens from a seeded generator, and models what routing can observe of a vLLM
engine: a finite KV block cache with prefix caching and LRU eviction, continuous
batching with chunked prefill and preemption, and step times from a cost model
fitted against a real vLLM CPU worker (docs/sim.md). It is never a stand-in for a
real engine in a test that claims an engine works.

Pure core (no I/O, no clock; drivable in virtual time):
  `config` (SimConfig, CostModel), `cache` (BlockCache), `request`, `scheduler`,
  `outputs`, `engine` (SimEngine: add_request / abort / step / next_event_time),
  `kv_events` (vLLM's event shapes and msgpack form), `profile`.
Live worker (a thin async driver around the core):
  `driver`, `publisher` (ZMQ PUB + replay ROUTER), `metrics`, `openai_api`,
  `server`, `launch` (`sluice worker --engine sim`, `python -m engines.sim`).
"""

from __future__ import annotations

from engines.sim.model.config import CostModel, SimConfig, StepWork
from engines.sim.model.engine import EngineSnapshot, RequestSpec, SimEngine
from engines.sim.model.outputs import EngineCounters, RequestOutput, StepResult
from engines.sim.model.profile import Profile, load_profile

__all__ = ["CostModel", "EngineCounters", "EngineSnapshot", "Profile", "RequestOutput", "RequestSpec",
           "SimConfig", "SimEngine", "StepResult", "StepWork", "load_profile"]
