"""Early refusal: a request whose time to first token is predicted past its deadline on every
worker that could serve it is refused at once, rather than admitted to time out later.

The prediction is the gateway's queue wait for its class and tenant (gateway.llm.admission.gate,
`predicted_wait_s`: the slots ahead of it over the rate slots free at) plus the best of the
router's predicted TTFTs over the request's ranked workers (router.cost: the worker's own queue
and prefill, fitted online to the TTFTs it observes). A worker the router has no prediction for
(an in-process engine) counts as the queue wait alone. Retry-After is how much later the
prediction would fit the deadline: the predicted drain time of the work ahead.

A request admitted on the prediction can still miss: the predictor's error is what
`sluice_llm_deadline_requests_total{outcome="missed"}` and the deadline benchmark
(loadtests/admission/bench_admission.py) measure.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.llm.admission.gate import Admission, deadline_error
from gateway.llm.admission.policy import Claim
from gateway.llm.targets import Target


def predicted_ttft_s(admission: Admission, claim: Claim, cost: int, targets: Sequence[Target]) -> float:
    """The request's predicted time to first token: the gateway queue, then the best worker's."""
    engine = min((t.predicted_ttft_s for t in targets if t.predicted_ttft_s is not None), default=0.0)
    return admission.predicted_wait_s(claim, cost) + engine


def refuse_if_late(admission: Admission, claim: Claim, cost: int, targets: Sequence[Target]) -> float | None:
    """Raise ErrorKind.DEADLINE when the prediction passes the request's deadline; else the prediction
    (None: no deadline, nothing predicted)."""
    if claim.deadline_s is None:
        return None
    predicted = predicted_ttft_s(admission, claim, cost, targets)
    if predicted > claim.deadline_s:
        admission.observe("refused:deadline_unmeetable", claim)
        raise deadline_error(f"The request's time-to-first-token deadline of {claim.deadline_s:g} s cannot be met: "
                             f"the first token is predicted in {predicted:.2f} s; retry later.",
                             predicted - claim.deadline_s, "deadline_unmeetable")
    return predicted
