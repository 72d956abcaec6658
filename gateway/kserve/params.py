"""KServe `generate` parameters, as one pydantic model shared by HTTP and gRPC.

The HTTP body is `{"text_input": "...", "parameters": {...}}`; other top-level keys
are merged into the parameters (Triton maps them to model inputs). gRPC sends the
same names as `ModelInferRequest.parameters`. Unknown parameters are ignored, as
Triton's LLM backends ignore inputs they do not declare; known ones are typed
strictly (a bool is not an integer, a string is not a number).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator

from engines.errors import ErrorKind, SluiceError
from gateway.llm.params import GenerationParams

_Number = Annotated[float, Field(strict=False)]


class GenerateParams(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    # Types only: ranges are checked protocol-neutrally by `gateway.llm.params.check`.
    max_tokens: StrictInt | None = None
    max_new_tokens: StrictInt | None = None  # Triton's TRT-LLM name for max_tokens
    temperature: _Number | None = None
    top_p: _Number | None = None
    top_k: StrictInt | None = None
    min_p: _Number = 0.0
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    min_tokens: StrictInt = 0
    repetition_penalty: _Number = 1.0
    presence_penalty: _Number = 0.0
    frequency_penalty: _Number = 0.0
    include_stop_str_in_output: StrictBool = False

    @field_validator("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty", mode="before")
    @classmethod
    def _not_bool(cls, v: Any) -> Any:
        if isinstance(v, (bool, str)):
            raise ValueError("must be a number")
        return v

    def generation(self) -> GenerationParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return GenerationParams(
            max_tokens=self.max_tokens if self.max_tokens is not None else self.max_new_tokens,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p, seed=self.seed,
            stop=stop, stop_token_ids=tuple(self.stop_token_ids or ()), ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens, repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            include_stop_str_in_output=self.include_stop_str_in_output)


def parse_params(raw: dict[str, Any]) -> GenerationParams:
    """Validated parameters, or SluiceError(INVALID_ARG) naming the first bad one."""
    try:
        return GenerateParams.model_validate(raw).generation()
    except ValidationError as e:
        first = e.errors()[0]
        name = ".".join(str(p) for p in first.get("loc", ())) or "parameters"
        raise SluiceError(f"parameter '{name}': {first.get('msg', 'invalid value')}", ErrorKind.INVALID_ARG,
                          param=name) from None
