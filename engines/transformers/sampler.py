"""Per-request seeded sampling for transformers' continuous batching.

transformers samples every row of a batch with one global RNG, so a seeded
request's output would depend on its batch neighbours. This processor runs last
in the logits chain: for a row whose request carries a seed it draws the token
from a generator seeded by (seed, step) and masks every other token, so the
manager's own multinomial draw can only pick that token. Rows without a seed
are untouched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from engines.transformers import compat
from engines.transformers.requests import NO_SEED

if TYPE_CHECKING:
    from transformers import ContinuousBatchingManager
    from transformers.generation.continuous_batching.requests import FutureRequestState


class SeededSampler:
    """A ContinuousBatchingLogitsProcessor (duck-typed) keyed by `sluice_seed`."""

    supported_kwargs: ClassVar[dict[str, type]] = {"sluice_seed": int}
    ignored_kwargs: ClassVar[tuple[str, ...]] = ()

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(NO_SEED)

    def prepare_tensor_args(self, requests_with_new_token: list[FutureRequestState]) -> torch.Tensor:
        args = []
        for request in requests_with_new_token:
            seed = int(compat.request_kwargs(request).get("sluice_seed", NO_SEED))
            if seed < 0:
                args.append(NO_SEED)
            else:
                # Mix in the step so each position draws fresh randomness,
                # deterministically; keep it a non-negative int32.
                step = compat.generated_count(request)
                args.append((seed * 1_000_003 + step * 7919) & 0x7FFFFFFF)
        return torch.tensor(args, dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        seeds = tensor_arg[: scores.size(0)].tolist()
        if all(s == NO_SEED for s in seeds):
            return scores
        scores = scores.clone()
        for row, seed in enumerate(seeds):
            if seed == NO_SEED:
                continue
            probs = torch.softmax(scores[row].float(), dim=-1)
            gen = torch.Generator(device="cpu").manual_seed(int(seed))
            token = int(torch.multinomial(probs.cpu(), 1, generator=gen))
            keep = scores[row, token].clone()
            scores[row].fill_(float("-inf"))
            scores[row, token] = keep
        return scores


def install_seeded_sampler(manager: ContinuousBatchingManager) -> None:
    """Add the sampler to a manager's logits chain, last; before `start()`."""
    compat.add_logits_processor(manager, SeededSampler(), SeededSampler.supported_kwargs)
