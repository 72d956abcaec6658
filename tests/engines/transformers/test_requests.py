"""What the transformers engine refuses and passes per request (pure; no model)."""

from __future__ import annotations

import pytest

from engines.base import EngineError, SamplingParams
from engines.errors import ErrorKind
from engines.transformers.requests import NO_SEED, check_prompt, check_sampling, end_token_ids, sampling_kwargs


@pytest.mark.parametrize("kw", [{"logprobs": 2}, {"min_p": 0.1}, {"repetition_penalty": 1.1},
                                {"presence_penalty": 0.5}, {"frequency_penalty": 0.5}, {"min_tokens": 2}])
def test_unsupported_sampling_is_refused(kw: dict[str, float]) -> None:
    with pytest.raises(EngineError) as err:
        check_sampling(SamplingParams(max_tokens=4, **kw))  # type: ignore[arg-type]
    assert err.value.kind is ErrorKind.UNSUPPORTED


@pytest.mark.parametrize(("ids", "kind"), [([], ErrorKind.INVALID_ARG), ([5, 100], ErrorKind.INVALID_ARG),
                                           ([-1], ErrorKind.INVALID_ARG), ([True], ErrorKind.INVALID_ARG),
                                           ([1] * 10, ErrorKind.CONTEXT_TOO_LONG)])
def test_bad_prompts_are_refused_before_they_reach_the_manager(ids: list[int], kind: ErrorKind) -> None:
    with pytest.raises(EngineError) as err:
        check_prompt(ids, vocab_size=100, context_tokens=10)
    assert err.value.kind is kind
    check_prompt([0, 99], vocab_size=100, context_tokens=10)


def test_greedy_is_top_k_one_and_never_seeded() -> None:
    kw = sampling_kwargs(SamplingParams(max_tokens=4, temperature=0.0, seed=5), vocab_size=100)
    assert kw == {"temperature": 1.0, "top_k": 1, "top_p": 1.0, "sluice_seed": NO_SEED}


def test_sampling_passes_its_values_and_a_non_negative_int32_seed() -> None:
    kw = sampling_kwargs(SamplingParams(max_tokens=4, temperature=0.7, top_p=0.9, seed=-3), vocab_size=100)
    assert kw == {"temperature": 0.7, "top_k": 100, "top_p": 0.9, "sluice_seed": -3 & 0x7FFFFFFF}


def test_end_ids_are_eos_unless_ignored_plus_stop_ids() -> None:
    assert end_token_ids(SamplingParams(max_tokens=4, stop_token_ids=(7, 2)), [2]) == [2, 7]
    assert end_token_ids(SamplingParams(max_tokens=4, ignore_eos=True, stop_token_ids=(7,)), [2]) == [7]
