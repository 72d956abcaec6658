"""`--k8s-discovery SPEC` parsing and the EndpointSlice → worker mapping (pure parts of gateway/discovery)."""

from __future__ import annotations

import pytest

from gateway.discovery.slices import SliceCache, endpoints_of, ready_workers
from gateway.discovery.spec import parse_discovery
from gateway.settings import Settings
from tests.standins.k8s_api_standin import endpoint_slice, selector_matches


def test_key_value_spec() -> None:
    spec = parse_discovery("namespace=sluice,selector=app.kubernetes.io/component=vllm-worker,port=http,"
                           "engine=vllm,drain_s=5")
    assert (spec.namespace, spec.selector, spec.port, spec.engine, spec.drain_s) == (
        "sluice", "app.kubernetes.io/component=vllm-worker", "http", "vllm", 5.0)


def test_a_selector_may_have_several_terms_and_json_is_accepted() -> None:
    spec = parse_discovery("selector=app.kubernetes.io/component=vllm-worker,app.kubernetes.io/part-of=sluice,"
                           "namespace=ns")
    assert spec.selector == "app.kubernetes.io/component=vllm-worker,app.kubernetes.io/part-of=sluice"
    assert spec.namespace == "ns"
    js = parse_discovery('{"namespace": "a", "selector": "engine=x,tier in (gpu,cpu)", "engine": "trtllm"}')
    assert (js.selector, js.engine, js.port) == ("engine=x,tier in (gpu,cpu)", "trtllm", "http")


@pytest.mark.parametrize(("value", "message"), [
    ("namespace=sluice", "selector= is required"),
    ("selector=a=b,engine=tgi", "engine= must be one of"),
    ("selector=a=b,port=70000", "port=70000 is not a port number"),
    ("selector=a=b,drain_s=soon", "drain_s= must be a number"),
    ("flavour=x,selector=a=b", "expected KEY=VALUE"),
    ('{"selector": "a=b", "colour": "x"}', "unknown option(s) colour"),
    ("{not json", "not valid JSON"),
])
def test_bad_specs_are_refused_with_a_message(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_discovery(value)


def test_settings_read_specs_from_the_environment_and_check_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_K8S_DISCOVERY", '["selector=app=w,namespace=x"]')
    settings = Settings()
    assert settings.k8s_discovery == ("selector=app=w,namespace=x",) and settings.workers_only
    monkeypatch.setenv("SLUICE_K8S_DISCOVERY", '["namespace=x"]')
    with pytest.raises(ValueError, match="selector= is required"):
        Settings()


def test_ready_endpoints_become_workers_named_by_pod() -> None:
    obj = endpoint_slice("s1", "svc", [("pod-a", "10.0.0.1", True), ("pod-b", "10.0.0.2", False),
                                       ("pod-c", "10.0.0.3", True)], port=8100)
    # A Service with publishNotReadyAddresses keeps a terminating pod `ready`.
    obj["endpoints"][2]["conditions"] = {"ready": True, "serving": True, "terminating": True}
    eps = endpoints_of(obj, "http")
    assert [(e.name, e.url, e.ready) for e in eps] == [
        ("pod-a", "http://10.0.0.1:8100", True), ("pod-b", "http://10.0.0.2:8100", False),
        ("pod-c", "http://10.0.0.3:8100", False)]  # terminating: leaving, whatever `ready` says
    assert endpoints_of(obj, "8100") == eps  # a port by number
    assert endpoints_of(obj, "grpc") == []  # the slice has no such port


def test_unset_ready_means_ready_and_ipv6_is_bracketed() -> None:
    obj = endpoint_slice("s1", "svc", [("pod-a", "fd00::1", True)], port=8100)
    obj["addressType"] = "IPv6"
    obj["endpoints"][0]["conditions"] = {}
    assert ready_workers([obj], "http") == {"pod-a": "http://[fd00::1]:8100"}


def test_a_pod_in_two_slices_is_ready_if_either_says_so() -> None:
    old = endpoint_slice("s1", "svc", [("pod-a", "10.0.0.1", False)], port=8100)
    new = endpoint_slice("s2", "svc", [("pod-a", "10.0.0.1", True)], port=8100)
    assert ready_workers([old, new], "http") == {"pod-a": "http://10.0.0.1:8100"}
    assert ready_workers([new, old], "http") == {"pod-a": "http://10.0.0.1:8100"}


def test_slice_cache_follows_events_and_versions() -> None:
    cache = SliceCache()
    a = endpoint_slice("s1", "svc", [("pod-a", "10.0.0.1", True)], port=8100)
    a["metadata"]["resourceVersion"] = "5"
    cache.replace([a], "7")
    assert cache.resource_version == "7" and list(cache.slices) == ["s1"]
    b = {**a, "metadata": {**a["metadata"], "name": "s2", "resourceVersion": "8"}}
    assert cache.apply("ADDED", b) and cache.resource_version == "8"
    assert not cache.apply("MODIFIED", b)  # the same object again changes nothing
    assert not cache.apply("BOOKMARK", {"metadata": {"resourceVersion": "12"}}) and cache.resource_version == "12"
    assert cache.apply("DELETED", {**b, "metadata": {**b["metadata"], "resourceVersion": "13"}})
    assert list(cache.slices) == ["s1"] and cache.resource_version == "13"
    with pytest.raises(ValueError, match="unexpected watch event type 'ERROR'"):
        cache.apply("ERROR", {"metadata": {}})


@pytest.mark.parametrize(("selector", "labels", "expected"), [
    ("a=b", {"a": "b"}, True), ("a==b", {"a": "c"}, False), ("a!=b", {"a": "c"}, True),
    ("a", {"a": ""}, True), ("!a", {"a": "x"}, False), ("a in (x,y),b", {"a": "y", "b": "1"}, True),
    ("a notin (x,y)", {"a": "x"}, False), ("a=b,c=d", {"a": "b"}, False),
])
def test_the_standins_label_selectors(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert selector_matches(selector, labels) is expected
