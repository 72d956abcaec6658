"""Resuming a stream on another worker when its worker is lost mid-answer.

When a worker's stream breaks after the client has had text (the connection failed, or the worker
sent nothing for `--worker-stall-timeout-s`), `Dispatch` asks this module whether and how the choice
can go on elsewhere:

- `Sent` records, per choice, what its client has been sent: the token ids and the text, in order,
  and the prompt as the worker ran it (a chat worker renders its own and says so).
- `resume_point` finds how many of those ids the client holds as text. Tokens whose text a worker
  held back (the tail of a character split across tokens) are left out, and generated again; text
  a worker held back behind whole tokens is owed to the client and sent first; with stop strings
  those tokens are generated again instead, so the next worker sees a stop string that straddles
  the resume point (refused when the held text ends inside a token). The text of the ids is
  decoded with the model's tokenizer after the prompt's last tokens, as the engine detokenizes
  (`engines.text.detokenizer.prompt_context`); it is never re-tokenized.
- `resume_request` is the same request as a token-id completion: the prompt's ids followed by the
  committed ids, `max_tokens` (and `min_tokens`) less what was committed, the same sampling and seed.
- `refusal` names why a request must not be resumed at all: a chat whose engine parsers hold state
  mid-stream (tools, reasoning output, structured output), or a worker that sends no token ids.

Greedy decoding resumes token for token what the lost worker would have sent. A seeded sample
resumes as a deterministic function of the seed and the resume point, not as the uninterrupted
sample (an engine seeds a request's generator when it starts). Presence and frequency penalties
count only generated tokens, so with them the resumed part sees the committed tokens as prompt.
"""

from gateway.llm.migration.migrator import Migrator, Then
from gateway.llm.migration.resume import MigrationConfig, Resumed, ResumePoint, Sent

__all__ = ["MigrationConfig", "Migrator", "ResumePoint", "Resumed", "Sent", "Then"]
