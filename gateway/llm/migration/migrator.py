"""`Migrator`: moves a choice whose worker was lost mid-answer to the next-best worker, and counts it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from engines.base import Delta, EngineRequest
from engines.errors import SluiceError
from gateway.llm.accounting import account_finished
from gateway.llm.metrics import LLMMetrics
from gateway.llm.migration.resume import (
    Detokenizer,
    MigrationConfig,
    Resumed,
    ResumePoint,
    Sent,
    ended_already,
    refusal,
    resume_point,
    resume_request,
)
from gateway.llm.targets import Target

log = logging.getLogger("sluice.migration")


Then = Literal["attempt", "end", "fail"]  # what a dispatch does after `Migrator.resume`


class Choice(Protocol):
    """What a migration reads and moves of one choice of a dispatch (`gateway.llm.dispatch.Choice`)."""

    request: EngineRequest
    targets: list[Target]
    current: int
    completion_tokens: int
    sent: Sent
    origin: EngineRequest | None
    resumed: Resumed | None
    lost: set[str]


@dataclass(frozen=True, slots=True)
class Migrator:
    """How one request's lost streams resume: the limits, the router's ranking for a resume (priced
    as its long prompt, marked as a resume) and the model's tokenizer."""

    config: MigrationConfig
    rank: Callable[[EngineRequest], list[Target]]
    tokenizer: Detokenizer

    def resume(self, metrics: LLMMetrics, model: str, choice: Choice, lost: Delta | SluiceError, *,
               seen_lost: bool = True) -> tuple[list[Delta], Then]:
        """After `choice`'s worker was lost mid-answer: the deltas the client gets now, and whether the
        caller opens the resume's attempt on `choice.targets[choice.current]` ("attempt"), the answer is
        whole ("end"), or it ends with `lost` ("fail"). `seen_lost`: the worker's stream broke or stalled
        (it is marked down); False for a resume it refused before its first byte (busy, not lost)."""
        cause = lost.fault if isinstance(lost, Delta) and lost.fault is not None else "broken"
        lost_target = choice.targets[choice.current]
        origin = choice.origin or choice.request
        plan = self._plan(choice, origin)
        if isinstance(plan, str):
            return self._give_up(metrics, model, choice, lost, cause, plan)
        point, prompt = plan
        choice.lost.add(lost_target.name)
        if seen_lost and lost_target.on_lost is not None:
            lost_target.on_lost()  # marked down before the resume is ranked
        del choice.sent.ids[len(point.committed):]  # tokens generated again are sent again
        out = [Delta(text=point.owed, completion_tokens=len(point.committed))] if point.owed else []
        choice.sent.pieces.append(point.owed)
        choice.completion_tokens = len(point.committed)
        ended = ended_already(origin, point.committed, self.tokenizer.eos_token_id)
        if ended is not None:  # only the worker's final event was lost
            ended.prompt_tokens = len(prompt)
            account_finished(metrics, model, origin, ended)
            self._count(metrics, model, cause, "resumed", lost_target.name, origin, len(point.committed))
            return [*out, ended], "end"
        request = resume_request(origin, prompt, point.committed, choice.sent.migrations + 1)
        try:
            targets = [t for t in self.rank(request) if t.name not in choice.lost]
        except SluiceError:
            targets = []
        if not targets:
            return self._give_up(metrics, model, choice, lost, cause, "no_worker")
        first = choice.targets[0]
        choice.origin, choice.request, choice.current = origin, request, 1
        choice.targets = [replace(first, on_dispatch=None, on_first_token=None, on_finish=None, on_lost=None),
                          *targets]
        choice.resumed = Resumed(len(point.committed), len(prompt), point.ahead)
        choice.sent.migrations += 1
        self._count(metrics, model, cause, "resumed", lost_target.name, origin, len(point.committed), targets[0].name)
        return out, "attempt"

    def _plan(self, choice: Choice, origin: EngineRequest) -> tuple[ResumePoint, list[int]] | str:
        sent = choice.sent
        if sent.migrations >= self.config.max_migrations:
            return "budget_spent"
        reason = refusal(origin, sent)
        if reason is not None:
            return reason
        prompt = sent.worker_prompt or origin.prompt_token_ids
        point = resume_point(self.tokenizer, prompt, sent, bool(origin.sampling.stop), origin.sampling.greedy)
        if isinstance(point, str):
            return point
        if len(point.committed) < len(sent.ids) and origin.sampling.logprobs is not None:
            return "logprobs_sent"  # the client has the logprobs of the tokens that would be generated again
        if len(point.committed) > self.config.max_replay_tokens:
            return "replay_bound"
        return point, prompt

    def _give_up(self, metrics: LLMMetrics, model: str, choice: Choice, lost: Delta | SluiceError, cause: str,
                 reason: str) -> tuple[list[Delta], Then]:
        origin = choice.origin or choice.request
        self._count(metrics, model, cause, reason, choice.targets[choice.current].name, origin, len(choice.sent.ids))
        if isinstance(lost, SluiceError):
            return [], "fail"
        account_finished(metrics, model, origin, lost)
        return [lost], "fail"

    def _count(self, metrics: LLMMetrics, model: str, cause: str, outcome: str, worker: str, origin: EngineRequest,
               tokens: int, to: str | None = None) -> None:
        metrics.migrations.labels(model, cause, outcome).inc()
        if to is not None:
            log.warning("request %s: worker %s lost mid-answer (%s) after %d tokens; resumed on %s",
                        origin.request_id, worker, cause, tokens, to)
        else:
            log.warning("request %s: worker %s lost mid-answer (%s) after %d tokens; not resumed: %s",
                        origin.request_id, worker, cause, tokens, outcome)

