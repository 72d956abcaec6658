"""LLM admission: how many requests run, who waits, who goes next, and who is refused early.

`gate` holds the limits and the tickets, `fair` the order (priority classes, fair queuing by
tokens across tenants), `policy` what a request claims (tenant, weight, class, deadline), and
`deadlines` the early refusal of a request whose predicted time to first token passes its deadline.
"""

from gateway.llm.admission.gate import Admission, AdmissionConfig, QueueFull, Ticket, deadline_error
from gateway.llm.admission.policy import (
    DEADLINE_HEADER,
    DEFAULT_CLAIM,
    PRIORITY_HEADER,
    Asks,
    Claim,
    ClaimFor,
    claims_of,
    open_claim,
    resolve,
)

__all__ = [
    "DEADLINE_HEADER",
    "DEFAULT_CLAIM",
    "PRIORITY_HEADER",
    "Admission",
    "AdmissionConfig",
    "Asks",
    "Claim",
    "ClaimFor",
    "QueueFull",
    "Ticket",
    "claims_of",
    "deadline_error",
    "open_claim",
    "resolve",
]
