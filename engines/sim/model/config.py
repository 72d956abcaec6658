"""The simulated engine's configuration: its cost model and its shape. Pure, no I/O.

`CostModel.step_s(work)` is the time one engine step (one forward pass of the
continuous batch) takes:

    step_s = base_s
           + prefill_token_s × prefill_tokens      (uncached prompt tokens run this step)
           + prefill_attn_s  × prefill_attn_pairs  (their query × key token pairs)
           + decode_seq_s    × decode_seqs         (sequences decoding one token)

and 0 for a step that runs nothing. Besides the steps, a request reaches the
scheduler `request_latency_s` after it arrives: in vLLM the API server's input
processing and the hop to the engine core (and, on the way out, detokenizing and
writing the first chunk) add this to every time to first token without occupying
the engine. The parameters are fitted against a real vLLM worker by
`loadtests/sim/calibrate.py` (docs/sim.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(frozen=True, slots=True)
class StepWork:
    """What one step runs, in the units the cost model charges for."""

    prefill_tokens: int = 0  # uncached prompt (or recomputed) tokens scheduled this step
    # Σ over prefill chunks of the (query, key) pairs their attention computes: a chunk of
    # n tokens after s computed ones has n·s + n(n+1)/2. It makes long prompts super-linear.
    prefill_attn_pairs: int = 0
    decode_seqs: int = 0  # running sequences that each decode one token

    @property
    def empty(self) -> bool:
        return self.prefill_tokens == 0 and self.decode_seqs == 0


@dataclass(frozen=True, slots=True)
class CostModel:
    """Seconds per step, linear in the work; every coefficient is >= 0. All zero: no delay."""

    base_s: float = 0.0  # fixed cost of a step that runs anything (scheduling, launch, sampling)
    prefill_token_s: float = 0.0  # per prefill token (the MLP and projections)
    prefill_attn_s: float = 0.0  # per prefill (query, key) token pair
    decode_seq_s: float = 0.0  # per decoding sequence
    request_latency_s: float = 0.0  # arrival to schedulable; adds to TTFT, not to any step

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1e6:
                raise ValueError(f"cost parameter {f.name} must be a number of seconds >= 0, got {value!r}")

    @property
    def zero(self) -> bool:
        return all(getattr(self, f.name) == 0.0 for f in fields(self))

    @property
    def step_fields(self) -> tuple[float, float, float, float]:
        return self.base_s, self.prefill_token_s, self.prefill_attn_s, self.decode_seq_s

    def step_s(self, work: StepWork) -> float:
        if work.empty:
            return 0.0
        return (self.base_s + self.prefill_token_s * work.prefill_tokens
                + self.prefill_attn_s * work.prefill_attn_pairs + self.decode_seq_s * work.decode_seqs)


COST_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(CostModel))


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated engine. The defaults are vLLM 0.32's on CPU (OpenAI server)."""

    vocab_size: int  # output tokens are drawn from [0, vocab_size) minus `special_token_ids`
    max_model_len: int = 2048  # prompt + output tokens of one request at most
    block_size: int = 128  # tokens per KV block (vLLM on CPU: 128)
    num_gpu_blocks: int = 2048  # KV capacity in blocks (vLLM: from the KV memory it is given)
    max_num_seqs: int = 128  # running requests at most (the batch bound)
    max_num_batched_tokens: int = 2048  # tokens scheduled per step at most (the token budget)
    cost: CostModel = field(default_factory=CostModel)
    eos_token_id: int | None = None
    # Chance that a generated token is EOS, for requests that do not ignore EOS. 0 (the
    # default): never EOS, so every request runs to max_tokens, as load tests want.
    eos_prob: float = 0.0
    special_token_ids: frozenset[int] = frozenset()  # never drawn as ordinary output

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_model_len", "block_size", "num_gpu_blocks", "max_num_seqs",
                     "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.num_gpu_blocks * self.block_size < self.max_model_len:
            raise ValueError(f"the KV cache ({self.num_gpu_blocks} blocks of {self.block_size} tokens) cannot "
                             f"hold one request of max_model_len {self.max_model_len}; lower max_model_len or "
                             "give it more blocks")
        if sum(1 for t in self.special_token_ids if 0 <= t < self.vocab_size) >= self.vocab_size:
            raise ValueError("the vocabulary has no ordinary token to generate")
        if not 0.0 <= self.eos_prob <= 1.0:
            raise ValueError(f"eos_prob must be in [0, 1], got {self.eos_prob}")
        if self.eos_prob > 0 and self.eos_token_id is None:
            raise ValueError("eos_prob > 0 needs the tokenizer's eos_token_id")
