"""Per-request seeded sampling for transformers' continuous batching.

transformers samples every row of a batch with one global RNG, so a seeded
request's output would depend on its batch neighbours. This processor runs last
in the logits chain: for a row whose request carries a seed it draws the token
from a generator seeded by (seed, step) and masks every other token, so the
manager's own multinomial draw can only pick that token. Rows without a seed
are untouched.
"""

from __future__ import annotations

from typing import Any

import torch

_NO_SEED = -1


class SeededSampler:
    """A ContinuousBatchingLogitsProcessor (duck-typed) keyed by `sluice_seed`."""

    supported_kwargs: dict[str, type] = {"sluice_seed": int}
    ignored_kwargs: tuple[str, ...] = ()

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(_NO_SEED)

    def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> torch.Tensor:
        args = []
        for request in requests_with_new_token:
            seed = int(request.state.logit_processor_kwargs.get("sluice_seed", _NO_SEED))
            if seed < 0:
                args.append(_NO_SEED)
            else:
                # Mix in the step so each position draws fresh randomness,
                # deterministically; keep it a non-negative int32.
                step = len(request.state.generated_tokens)
                args.append((seed * 1_000_003 + step * 7919) & 0x7FFFFFFF)
        return torch.tensor(args, dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        seeds = tensor_arg[: scores.size(0)].tolist()
        if all(s == _NO_SEED for s in seeds):
            return scores
        scores = scores.clone()
        for row, seed in enumerate(seeds):
            if seed == _NO_SEED:
                continue
            probs = torch.softmax(scores[row].float(), dim=-1)
            gen = torch.Generator(device="cpu").manual_seed(int(seed))
            token = int(torch.multinomial(probs.cpu(), 1, generator=gen))
            keep = scores[row, token].clone()
            scores[row].fill_(float("-inf"))
            scores[row, token] = keep
        return scores


def install_seeded_sampler(manager: Any) -> None:
    """Append the sampler to a manager's processor list before `start()` sizes its buffers."""
    from transformers.generation.continuous_batching.cb_logits_processors import (
        ContinuousBatchingLogitsProcessor,
    )

    ContinuousBatchingLogitsProcessor.register(SeededSampler)
    plist = manager.logit_processor
    plist.logits_processor.append(SeededSampler())
    plist.tensors_required += 1
    plist.supported_keys.update(SeededSampler.supported_kwargs)
    plist.do_processing = True
