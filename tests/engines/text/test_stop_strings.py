"""StopMatcher against a brute-force oracle that rescans the whole text at every piece."""

from __future__ import annotations

import random

import pytest

from engines.text.stop_strings import StopMatcher


def oracle(pieces: list[str], stop: tuple[str, ...], include: bool) -> list[tuple[str, bool]]:
    """What has been sent after each piece: the whole text so far, cut at the first stop string
    to complete, minus the longest suffix that could still become a stop string."""
    sent: list[tuple[str, bool]] = []
    text = ""
    for k, piece in enumerate(pieces):
        text += piece
        ends = [(text.index(s) + len(s)) if include else text.index(s) for s in stop if s in text]
        if ends:
            sent.append((text[: min(ends)], True))
            return sent
        last = k == len(pieces) - 1
        partial = 0 if last else max(
            (n for s in stop for n in range(1, len(s)) if text.endswith(s[:n])), default=0)
        sent.append((text[: len(text) - partial], False))
    return sent


def run(matcher: StopMatcher, pieces: list[str]) -> list[tuple[str, bool]]:
    sent: list[tuple[str, bool]] = []
    text = ""
    for k, piece in enumerate(pieces):
        out = matcher.feed(piece, last=k == len(pieces) - 1)
        text += out.text
        sent.append((text, out.stopped))
        if out.stopped:
            break
    return sent


@pytest.mark.parametrize("include", [False, True])
def test_matches_a_full_rescan_on_random_text(include: bool) -> None:
    rng = random.Random(7)
    for _ in range(400):
        stop = tuple("".join(rng.choices("abc", k=rng.randint(1, 4))) for _ in range(rng.randint(1, 4)))
        text = "".join(rng.choices("abcd", k=rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(1, 6))))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert run(StopMatcher(stop, include), pieces) == oracle(pieces, stop, include), (stop, pieces)


def test_a_stop_string_that_completes_first_wins() -> None:
    # "cd" is complete before "abcdef" could be, so the output ends before "cd".
    assert run(StopMatcher(("abcdef", "cd")), list("abcdef"))[-1] == ("ab", True)


def test_the_scan_window_stays_shorter_than_the_longest_stop_string() -> None:
    stop = tuple(f"<end{i}>" for i in range(16))
    matcher = StopMatcher(stop)
    longest = max(map(len, stop))
    sent = []
    for i in range(8000):
        out = matcher.feed([" <", "end", "9", "1", " x"][i % 5])
        sent.append(out.text)
        assert len(matcher.held) < longest
    assert "".join(sent) + matcher.held == "".join([" <", "end", "9", "1", " x"][i % 5] for i in range(8000))


def test_no_stop_strings_pass_text_through() -> None:
    matcher = StopMatcher(("",))
    assert matcher.feed("abc") == ("abc", False)
