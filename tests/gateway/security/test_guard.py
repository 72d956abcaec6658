"""The access decision from settings, without a server: who may open what."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from engines.errors import ErrorKind, SluiceError
from gateway.security.access import Access
from gateway.security.guard import ANONYMOUS, build_security
from gateway.settings import Settings


def security(**kw: object):  # type: ignore[no-untyped-def]
    return build_security(Settings(model_repository=None, **kw), CollectorRegistry())


def kind(fn) -> ErrorKind | None:  # type: ignore[no-untyped-def]
    try:
        fn()
    except SluiceError as e:
        return e.kind
    return None


def test_api_and_admin_keys_open_only_their_own_routes() -> None:
    s = security(api_keys="sk-api-1,sk-both", admin_keys="sk-admin-1,sk-both", admin_key="sk legacy with spaces",
                 quota_rpm=7)
    api = s.authenticate(Access.API, "sk-api-1", local=True)
    assert api is not None and api.id.startswith("key-") and api.limits.rpm == 7
    assert kind(lambda: s.authenticate(Access.API, "sk-admin-1", local=True)) is ErrorKind.UNAUTHENTICATED
    assert kind(lambda: s.authenticate(Access.ADMIN, "sk-api-1", local=True)) is ErrorKind.UNAUTHENTICATED
    assert kind(lambda: s.authenticate(Access.ADMIN, None, local=True)) is ErrorKind.UNAUTHENTICATED
    assert s.authenticate(Access.ADMIN, "sk-admin-1", local=False) is not None
    assert s.authenticate(Access.ADMIN, "sk legacy with spaces", local=False) is not None
    assert s.authenticate(Access.ADMIN, "sk-both", local=False) and s.authenticate(Access.API, "sk-both", local=False)
    assert s.authenticate(Access.OPEN, None, local=False) is None
    assert s.authenticate(Access.METRICS, None, local=False) is None  # open unless asked


def test_without_keys_api_is_anonymous_and_admin_is_loopback_only() -> None:
    s = security(quota_concurrency=3)
    anonymous = s.authenticate(Access.API, "anything", local=False)
    assert anonymous is not None and anonymous.id == ANONYMOUS and anonymous.limits.concurrency == 3
    assert s.quotas.limits(ANONYMOUS).concurrency == 3
    assert s.authenticate(Access.ADMIN, None, local=True) is not None
    assert kind(lambda: s.authenticate(Access.ADMIN, None, local=False)) is ErrorKind.PERMISSION_DENIED


def test_metrics_key() -> None:
    s = security(api_keys="sk-api-1", admin_keys="sk-admin-1", metrics_require_key=True)
    assert kind(lambda: s.authenticate(Access.METRICS, None, local=True)) is ErrorKind.UNAUTHENTICATED
    assert s.authenticate(Access.METRICS, "sk-api-1", local=False) is None
    assert s.authenticate(Access.METRICS, "sk-admin-1", local=False) is None
    with pytest.raises(ValueError, match="metrics-require-key"):
        security(metrics_require_key=True)


def test_key_values_stay_out_of_settings_repr() -> None:
    settings = Settings(model_repository=None, api_keys="sk-api-secret", admin_keys="sk-admin-secret",
                        admin_key="sk-legacy-secret")
    assert "secret" not in repr(settings) and "secret" not in str(settings)
