"""IncrementalDetokenizer with a toy vocabulary (pure; no tokenizer needed)."""

from __future__ import annotations

from collections.abc import Sequence

from engines.text.detokenizer import IncrementalDetokenizer

VOCAB = {1: "The", 2: " capital", 3: " is", 4: " Par", 5: "is", 6: ".", 7: "\ufffd", 8: "é",
         9: " <", 10: "end", 11: "9", 12: "1", 13: ">"}


def decode(ids: Sequence[int]) -> str:
    text = "".join(VOCAB[i] for i in ids)
    # A "7" followed by "8" forms one character, as a multi-byte UTF-8 sequence would.
    return text.replace("\ufffdé", "É")


def run(ids: list[int], **kw: object) -> tuple[list[str], bool]:
    d = IncrementalDetokenizer(decode, **kw)  # type: ignore[arg-type]
    out, stopped = [], False
    for i, t in enumerate(ids):
        step = d.step([t], last=i == len(ids) - 1)
        out.append(step.text)
        if step.stopped:
            stopped = True
            break
    return out, stopped


def test_text_is_emitted_once_and_in_order() -> None:
    out, stopped = run([1, 2, 3, 4, 5, 6])
    assert "".join(out) == "The capital is Paris." and not stopped


def test_stop_string_is_cut_and_never_leaked_even_across_tokens() -> None:
    out, stopped = run([1, 2, 3, 4, 5, 6], stop=("Paris",))
    assert stopped and "".join(out) == "The capital is "
    assert " Par" not in out  # the partial match was held back, not sent then retracted


def test_stop_string_can_be_kept() -> None:
    out, _ = run([1, 2, 3, 4, 5, 6], stop=("Paris",), include_stop_str=True)
    assert "".join(out) == "The capital is Paris"


def test_held_back_prefix_is_released_when_it_does_not_match() -> None:
    out, stopped = run([1, 2, 3, 4, 6], stop=("Paris",))
    assert not stopped and "".join(out) == "The capital is Par."


def test_incomplete_character_is_held_back() -> None:
    d = IncrementalDetokenizer(decode)
    assert d.step([1]).text == "The"
    assert d.step([7]).text == ""  # only half a character so far
    assert d.step([8]).text == "É"


def test_incomplete_character_is_flushed_on_the_last_step() -> None:
    out, _ = run([1, 7])
    assert "".join(out) == "The\ufffd"


def test_nothing_is_sent_after_a_stop() -> None:
    d = IncrementalDetokenizer(decode, stop=("is",))
    first = d.step([1, 2, 3])
    assert first.stopped and first.text == "The capital "
    later = d.step([4, 5, 6], last=True)
    assert later.stopped and later.text == ""


class CountingDecode:
    """Counts the work the detokenizer asks of the tokenizer."""

    def __init__(self) -> None:
        self.calls = 0
        self.ids = 0
        self.chars = 0

    def __call__(self, ids: Sequence[int]) -> str:
        self.calls += 1
        self.ids += len(ids)
        text = decode(ids)
        self.chars += len(text)
        return text


def test_work_per_token_is_bounded_on_a_long_output_with_many_stop_strings() -> None:
    # Decoding the whole output at every token would decode 8000 * 8001 / 2 ids here.
    tokens = 8000
    stop = tuple(f"<end{i}>" for i in range(16))
    # "<end99" and "<end1 " look like stop strings for a while (held back), then are released;
    # the split "É" is held back as an incomplete character.
    pattern = [1, 9, 10, 11, 11, 2, 9, 10, 12, 3, 7, 8]
    body = (pattern * (tokens // len(pattern) + 1))[: tokens - 4]
    ids = [*body, 9, 10, 12, 13]  # " <end1>" ends it
    counter = CountingDecode()
    d = IncrementalDetokenizer(counter, stop)
    out, stopped = [], False
    for t in ids:
        step = d.step([t])
        out.append(step.text)
        stopped = step.stopped
    full = decode(ids)
    assert stopped and "".join(out) == full[: full.index("<end1>")]
    assert counter.calls <= 2 * tokens
    assert counter.ids <= 4 * tokens, f"{counter.ids} ids decoded for {tokens} tokens"
    assert counter.chars <= 4 * len(full), f"{counter.chars} characters decoded for {len(full)}"


# A SentencePiece-like decode: the first token of a sequence loses its leading space.
_WORDS = {1: " Tell", 2: " me", 3: " a", 4: " story", 10: " Once", 11: " upon", 12: " a", 13: " time"}


def _sp_decode(ids: Sequence[int]) -> str:
    return "".join(_WORDS[i] for i in ids).removeprefix(" ")


def test_an_answer_decoded_after_its_prompt_keeps_its_first_space_and_reads_on_when_resumed() -> None:
    from engines.text.detokenizer import decode_after, prompt_context

    prompt, answer = [1, 2, 3, 4], [10, 11, 12, 13]
    assert IncrementalDetokenizer(_sp_decode).step(answer[:1]).text == "Once"  # alone, the space is lost
    context = prompt_context(_sp_decode, prompt)
    whole = IncrementalDetokenizer(_sp_decode, context=context)
    texts = [whole.step([t]).text for t in answer]
    assert "".join(texts) == " Once upon a time"
    # Resumed after two tokens (gateway.llm.migration): the prompt is now the prompt and those tokens.
    resumed = IncrementalDetokenizer(_sp_decode, context=prompt_context(_sp_decode, prompt + answer[:2]))
    assert "".join(texts[:2]) + "".join(resumed.step([t]).text for t in answer[2:]) == " Once upon a time"
    assert decode_after(_sp_decode, context, answer) == " Once upon a time"
    assert decode_after(_sp_decode, [], answer) == "Once upon a time"


def test_the_context_is_the_shortest_suffix_without_an_incomplete_character() -> None:
    from engines.text.detokenizer import prompt_context

    def decode(ids: Sequence[int]) -> str:  # 0 then 1 are the two halves of a character
        return "".join("\ufffd" if i == 1 and (k == 0 or ids[k - 1] != 0) else "é" if i == 0 else "" if i == 1
                       else "x" for k, i in enumerate(ids))

    assert prompt_context(decode, [5, 6, 7, 8, 9]) == [6, 7, 8, 9]
    assert prompt_context(decode, [5, 0, 1, 7, 8, 9]) == [0, 1, 7, 8, 9]  # not from half a character
    assert prompt_context(decode, [1, 7, 8, 9]) == [1, 7, 8, 9]  # none without one: the last 4
    assert prompt_context(decode, [8, 9]) == [8, 9]
