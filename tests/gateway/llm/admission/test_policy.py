"""What a request may claim: keys-file entitlements, the priority and deadline headers, early refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.errors import ErrorKind, SluiceError
from gateway.llm.admission import Admission, AdmissionConfig, Asks, Claim, claims_of, open_claim
from gateway.llm.admission.deadlines import refuse_if_late
from gateway.llm.targets import Target
from gateway.security.keys import KeyRing, from_file


def ring(tmp_path: Path, text: str) -> KeyRing:
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    return KeyRing(from_file(path))


def test_keys_file_entitlements_become_claims(tmp_path: Path) -> None:
    keys = ring(tmp_path, """
- {id: chat, key: k1, tenant: acme, weight: 3, priority: standard, max_priority: interactive, ttft_deadline_ms: 2000}
- {id: etl, key: k2, priority: batch}
""")
    claim_for = claims_of((p.id, p.tenant or p.id, p.entitlement) for p in keys.principals())
    c = claim_for("chat", Asks())
    assert c == Claim("acme", 3.0, 1, 2.0) and c.engine_priority == 0
    assert claim_for("chat", Asks("interactive", "500")) == Claim("acme", 3.0, 0, 0.5)
    assert claim_for("chat", Asks("interactive")).engine_priority == -1
    etl = claim_for("etl", Asks())
    assert etl.priority == "batch" and etl.engine_priority == 1 and etl.deadline_s is None
    with pytest.raises(SluiceError) as e:
        claim_for("etl", Asks("standard"))  # above its max_priority (batch)
    assert e.value.kind is ErrorKind.PERMISSION_DENIED and "batch" in e.value.message


@pytest.mark.parametrize("asks", [Asks("urgent"), Asks(ttft_deadline_ms="0"), Asks(ttft_deadline_ms="-5"),
                                  Asks(ttft_deadline_ms="1e3"), Asks(ttft_deadline_ms="3600001"),
                                  Asks(ttft_deadline_ms="9" * 40)])
def test_malformed_asks_are_refused(asks: Asks) -> None:
    with pytest.raises(SluiceError) as e:
        open_claim(None, asks)
    assert e.value.kind is ErrorKind.INVALID_ARG


@pytest.mark.parametrize("entry, field", [
    ("{key: k, weight: 0}", "weight"), ("{key: k, weight: true}", "weight"), ("{key: k, weight: 1001}", "weight"),
    ("{key: k, priority: urgent}", "priority"), ("{key: k, priority: interactive, max_priority: batch}",
                                                  "max_priority"),
    ("{key: k, ttft_deadline_ms: 0}", "ttft_deadline_ms"), ("{key: k, ttft_deadline_ms: 1.5}", "ttft_deadline_ms"),
])
def test_keys_file_refuses_bad_scheduling_fields(tmp_path: Path, entry: str, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ring(tmp_path, f"- {entry}\n")


def test_keys_of_one_tenant_must_agree_on_its_weight(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="different weights"):
        ring(tmp_path, "- {key: k1, tenant: t, weight: 2}\n- {key: k2, tenant: t}\n")


def test_an_open_gateway_has_one_tenant_and_lets_a_request_ask_any_class() -> None:
    assert open_claim(None, Asks("interactive")).klass == 0
    assert open_claim(None, Asks()).tenant == "" and open_claim(None, Asks()).priority == "standard"


async def test_a_request_predicted_past_its_deadline_is_refused_before_it_queues() -> None:
    a = Admission(AdmissionConfig(max_running=1, max_queued=8))
    events: list[str] = []
    a.observer = lambda event, c, value: events.append(event)
    held = a.try_admit(1, Claim("a"))
    a.hold_s = 2.0  # one slot turns over every 2 s
    fast, slow = Target("w1", None, predicted_ttft_s=0.3), Target("w2", None, predicted_ttft_s=5.0)  # type: ignore[arg-type]
    refuse_if_late(a, Claim("b", deadline_s=3.0), 1, [slow, fast])  # 2 s queue + 0.3 s on w1: in time
    with pytest.raises(SluiceError) as e:
        refuse_if_late(a, Claim("b", deadline_s=2.0), 1, [slow, fast])
    assert e.value.kind is ErrorKind.DEADLINE and e.value.code == "deadline_unmeetable"
    assert e.value.retry_after_s == 1.0 and events == ["admitted", "refused:deadline_unmeetable"]
    refuse_if_late(a, Claim("b"), 1, [slow])  # no deadline: never refused here
    held.release(0)
