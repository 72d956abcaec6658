"""IncrementalDetokenizer with a toy vocabulary (pure; no tokenizer needed)."""

from __future__ import annotations

from engines.detokenizer import IncrementalDetokenizer

VOCAB = {1: "The", 2: " capital", 3: " is", 4: " Par", 5: "is", 6: ".", 7: "\ufffd", 8: "é"}


def decode(ids: list[int]) -> str:
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
