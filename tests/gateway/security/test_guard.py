"""The access decision from settings, without a server: who may open what."""

from __future__ import annotations

from pathlib import Path

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
    assert kind(lambda: s.authenticate(Access.REPOSITORY, "sk-api-1", local=True)) is ErrorKind.UNAUTHENTICATED
    assert kind(lambda: s.authenticate(Access.REPOSITORY, None, local=True)) is ErrorKind.UNAUTHENTICATED
    assert s.authenticate(Access.REPOSITORY, "sk-admin-1", local=False) is not None
    assert s.authenticate(Access.REPOSITORY, "sk legacy with spaces", local=False) is not None
    assert s.authenticate(Access.REPOSITORY, "sk-both", local=False)
    assert s.authenticate(Access.API, "sk-both", local=False)
    assert s.authenticate(Access.OPEN, None, local=False) is None
    assert s.authenticate(Access.METRICS, None, local=False) is None  # open unless asked


def test_without_keys_api_is_anonymous_and_admin_is_loopback_only() -> None:
    s = security(quota_concurrency=3)
    anonymous = s.authenticate(Access.API, "anything", local=False)
    assert anonymous is not None and anonymous.id == ANONYMOUS and anonymous.limits.concurrency == 3
    assert s.quotas.limits(ANONYMOUS).concurrency == 3
    assert s.authenticate(Access.REPOSITORY, None, local=True) is not None
    assert kind(lambda: s.authenticate(Access.REPOSITORY, None, local=False)) is ErrorKind.PERMISSION_DENIED


def test_metrics_key() -> None:
    s = security(api_keys="sk-api-1", admin_keys="sk-admin-1", metrics_require_key=True)
    assert kind(lambda: s.authenticate(Access.METRICS, None, local=True)) is ErrorKind.UNAUTHENTICATED
    # A tenant's API key does not read every key's usage: /metrics needs the metrics scope.
    assert kind(lambda: s.authenticate(Access.METRICS, "sk-api-1", local=False)) is ErrorKind.UNAUTHENTICATED
    assert s.authenticate(Access.METRICS, "sk-admin-1", local=False) is None
    with pytest.raises(ValueError, match="metrics-require-key"):
        security(metrics_require_key=True)
    with pytest.raises(ValueError, match="metrics-require-key"):
        security(api_keys="sk-api-1", metrics_require_key=True)


def test_scopes_open_only_their_routes(tmp_path: Path) -> None:
    keys = tmp_path / "admin.yaml"
    keys.write_text("- {id: repo, key: sk-repo, scopes: [repository]}\n"
                    "- {id: scrape, key: sk-scrape, scopes: [metrics]}\n"
                    "- {id: all, key: sk-all}\n")
    s = security(admin_keys_file=keys, registration_key="sk-reg", metrics_require_key=True)
    opens = {key: {a.value for a in (Access.REPOSITORY, Access.WORKERS, Access.METRICS)
                   if kind(lambda a=a, key=key: s.authenticate(a, key, local=True)) is None}
             for key in ("sk-repo", "sk-scrape", "sk-all", "sk-reg")}
    assert opens == {"sk-repo": {"repository"}, "sk-scrape": {"metrics"}, "sk-reg": {"workers"},
                     "sk-all": {"repository", "workers", "metrics"}}
    assert kind(lambda: s.authenticate(Access.REPOSITORY, "sk-reg", local=True)) is ErrorKind.PERMISSION_DENIED
    assert kind(lambda: s.authenticate(Access.WORKERS, "sk-other", local=True)) is ErrorKind.UNAUTHENTICATED
    try:
        s.authenticate(Access.REPOSITORY, "sk-reg", local=True)
    except SluiceError as e:
        assert "sk-reg" not in e.message and "'workers'" not in e.message and "'repository' scope" in e.message


def test_a_registration_key_alone_closes_repository_control_even_on_loopback() -> None:
    s = security(registration_key="sk-reg")
    assert kind(lambda: s.authenticate(Access.REPOSITORY, None, local=True)) is ErrorKind.UNAUTHENTICATED
    assert kind(lambda: s.authenticate(Access.WORKERS, None, local=True)) is ErrorKind.UNAUTHENTICATED
    assert s.authenticate(Access.WORKERS, "sk-reg", local=False) is not None


def test_keyless_loopback_refuses_a_browser() -> None:
    s = security()
    assert s.authenticate(Access.WORKERS, None, local=True) is not None
    assert kind(lambda: s.authenticate(Access.WORKERS, None, local=True, not_local="Origin")) \
        is ErrorKind.PERMISSION_DENIED


def test_key_values_stay_out_of_settings_repr() -> None:
    settings = Settings(model_repository=None, api_keys="sk-api-secret", admin_keys="sk-admin-secret",
                        admin_key="sk-legacy-secret")
    assert "secret" not in repr(settings) and "secret" not in str(settings)
