"""OutputStream on transformers' own GenerationOutput records (cumulative tokens per output)."""

from __future__ import annotations

from collections.abc import Sequence

from transformers.generation.continuous_batching.requests import GenerationOutput, RequestStatus

from engines.text.detokenizer import IncrementalDetokenizer
from engines.transformers.outputs import OutputStream

EOS = 0
VOCAB = {1: "The", 2: " capital", 3: " is", 4: " Paris", 5: ".", EOS: "<eos>"}


def decode(ids: Sequence[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


def stream(stop: tuple[str, ...] = ()) -> OutputStream:
    return OutputStream(IncrementalDetokenizer(decode, stop), prompt_tokens=7, end_ids={EOS})


def out(tokens: list[int], status: RequestStatus = RequestStatus.DECODING,
        error: str | None = None) -> GenerationOutput:
    return GenerationOutput(request_id="r", generated_tokens=tokens, status=status, error=error)


def test_only_new_tokens_are_relayed_and_the_eos_token_is_not_text() -> None:
    s = stream()
    first = s.on_output(out([1, 2]))
    assert first is not None and (first.text, first.token_ids, first.finish_reason) == ("The capital", [1, 2], None)
    last = s.on_output(out([1, 2, 3, EOS], RequestStatus.FINISHED))
    assert last is not None and (last.text, last.token_ids, last.finish_reason) == (" is", [3], "stop")
    assert (last.completion_tokens, last.prompt_tokens) == (4, 7) and s.manager_done


def test_a_request_that_runs_out_of_tokens_ends_with_length() -> None:
    s = stream()
    last = s.on_output(out([1, 2], RequestStatus.FINISHED))
    assert last is not None and last.finish_reason == "length" and last.token_ids == [1, 2]


def test_a_stop_string_ends_the_stream_while_the_manager_still_runs() -> None:
    s = stream(stop=(" is",))
    assert s.on_output(out([1, 2])) is not None
    last = s.on_output(out([1, 2, 3, 4]))
    assert last is not None and last.finish_reason == "stop" and last.text == ""
    assert not s.manager_done  # the engine must cancel it


def test_an_output_with_nothing_new_is_skipped_and_errors_end_the_stream() -> None:
    s = stream()
    assert s.on_output(out([1])) is not None
    assert s.on_output(out([1])) is None
    failed = s.on_output(out([1], RequestStatus.FAILED, error="boom"))
    assert failed is not None and (failed.finish_reason, failed.error, failed.completion_tokens) == ("error", "boom", 1)
    assert s.manager_done
