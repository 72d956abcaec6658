"""From transformers' streamed outputs to Deltas, for one request. Pure: no torch, no I/O.

The continuous-batching manager hands over cumulative outputs: each carries every
token generated so far, so only the ids past the last one relayed are new. The
final output of a request that ends on an EOS or stop token id carries that id,
which is not visible text.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engines.base import Delta, FinishReason
from engines.text.detokenizer import IncrementalDetokenizer

if TYPE_CHECKING:
    from transformers.generation.continuous_batching.requests import GenerationOutput


@dataclass(slots=True)
class OutputStream:
    detokenizer: IncrementalDetokenizer
    prompt_tokens: int
    end_ids: Collection[int]  # EOS and stop token ids: a request that ends on one ends with "stop"
    sent: int = 0  # generated tokens already relayed
    # The manager is done with the request: it need not be cancelled. A stop string
    # ends the stream while the manager may still be generating.
    manager_done: bool = False

    def on_output(self, out: GenerationOutput) -> Delta | None:
        """The Delta for one output, or None when it adds nothing. A Delta with a
        finish_reason is the request's last."""
        if out.error:
            self.manager_done = True
            return self._final("error", error=str(out.error))
        new = list(out.generated_tokens[self.sent :])
        done = out.is_finished()
        reason: FinishReason | None = None
        if done:
            last = out.generated_tokens[-1] if out.generated_tokens else None
            reason = "stop" if last in self.end_ids else "length"
            if reason == "stop" and new and new[-1] == last:
                new = new[:-1]
        step = self.detokenizer.step(new, last=done)
        self.sent = len(out.generated_tokens)
        self.manager_done = done
        if step.stopped:
            done, reason = True, "stop"
        if not (step.text or new or done):
            return None
        return Delta(text=step.text, token_ids=new, finish_reason=reason, prompt_tokens=self.prompt_tokens,
                     completion_tokens=self.sent)

    def aborted(self) -> Delta:
        return self._final("abort")

    def failed(self, error: str) -> Delta:
        """The engine failed underneath the request (its generation loop died)."""
        self.manager_done = True
        return self._final("error", error=error)

    def _final(self, reason: FinishReason, error: str | None = None) -> Delta:
        return Delta(finish_reason=reason, error=error, completion_tokens=self.sent, prompt_tokens=self.prompt_tokens)
