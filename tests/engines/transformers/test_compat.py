"""The transformers internals `engines/transformers/compat.py` relies on, checked on the installed transformers.

An upgrade that moves one fails here, naming it. The last tests run the adapter on a real
continuous-batching manager over a tiny randomly initialised Llama built in memory (no weights
are loaded from disk).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from engines.transformers import compat
from engines.transformers.sampler import install_seeded_sampler


def test_installed_transformers_is_in_the_tested_range() -> None:
    compat.check_version()


@pytest.mark.parametrize("found", ["5.23.1", "5.25.0", "6.0.0"])
def test_a_version_outside_the_tested_range_is_refused_naming_both(found: str) -> None:
    with pytest.raises(RuntimeError, match=rf"{compat.TESTED_RANGE}.*{found} is installed"):
        compat.check_version(found)


def test_every_internal_the_adapter_relies_on_exists() -> None:
    missing = compat.missing_internals()
    assert not missing, f"transformers internals moved: {', '.join(missing)}; update engines/transformers/compat.py"


def test_a_missing_internal_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.generation.continuous_batching.scheduler import Scheduler

    monkeypatch.delattr(Scheduler, "schedule_batch")
    assert compat.missing_internals() == ["Scheduler.schedule_batch"]


def tiny_manager() -> Any:
    import torch
    from transformers import ContinuousBatchingConfig, GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(config)
    model.set_attn_implementation("sdpa")
    # Non-neutral defaults, as the engine uses, so that per-request processors exist.
    gen = GenerationConfig.from_dict({"do_sample": True, "temperature": 0.5, "top_k": 100, "top_p": 0.99,
                                      "eos_token_id": [0], "pad_token_id": 0})
    cb = ContinuousBatchingConfig(per_request_processors=True, max_requests_per_batch=4, max_batch_tokens=64,
                                  num_blocks=16, page_size=16, use_cuda_graph=False)
    return model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)


async def generate(manager: Any, rid: str, prompt: list[int], seed: int) -> list[int]:
    done: asyncio.Queue[Any] = asyncio.Queue()
    manager.register_result_handler(rid, done.put_nowait)
    manager.add_request(input_ids=prompt, request_id=rid, max_new_tokens=6, streaming=False, eos_token_id=-1,
                        temperature=1.0, top_k=128, top_p=1.0, sluice_seed=seed)
    out = await asyncio.wait_for(done.get(), 60)
    assert out.error is None and out.is_finished()
    return list(out.generated_tokens)


async def test_the_adapter_works_on_a_real_manager() -> None:
    manager = tiny_manager()
    compat.require_internals(manager)
    install_seeded_sampler(manager)
    sizes: list[int] = []
    compat.watch_batch_sizes(manager, sizes.append)
    manager.start()
    try:
        alone = await generate(manager, "alone", [1, 2, 3], seed=42)
        together = await asyncio.gather(generate(manager, "a", [1, 2, 3], seed=42),
                                        *(generate(manager, f"n{i}", [5, 6, 7, 8], seed=i) for i in range(3)))
        # The seed, not the batch neighbours, decides a seeded request's tokens.
        assert together[0] == alone
        assert sizes and max(sizes) > 1
        loop = asyncio.get_running_loop()
        router = manager.output_router
        router.result_handlers["x"] = (lambda _out: None, loop)
        compat.sink_result_handler(manager, "x")
        assert router.result_handlers["x"][1] is loop
        compat.drop_result_handler(manager, "x")
        assert "x" not in router.result_handlers
    finally:
        manager.stop(True, 10)
