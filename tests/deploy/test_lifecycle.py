"""How the manifests start, stop and scale pods, against what the programs they run do: the grace
period covers preStop, the drain and the shutdown the settings ask for; start-up probes allow what
`sluice worker`'s own start-up limit allows; no fixed `replicas` fights an HPA; and inference is
never served without API keys."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest

from engines.launchers import registration
from engines.launchers.spec import WorkerSpec
from gateway.http import server
from gateway.settings import Settings
from tests.deploy.pods import overlay_docs, templates
from tests.deploy.validation import OVERLAYS, by_kind

Obj = dict[str, Any]
PROBE_SLACK_S = 120  # a start-up probe may outlast the launcher's own limit by this much, no more


def _source_number(module: object, pattern: str) -> float:
    found = re.search(pattern, inspect.getsource(module))  # type: ignore[arg-type]
    assert found, f"{pattern} is gone from {module}: update this test's model of shutting down"
    return float(found.group(1))


def _env(docs: list[Obj], container: Obj) -> dict[str, str]:
    """The container's plain environment: its ConfigMaps (envFrom), then its own `value`s."""
    maps = {d["metadata"]["name"]: d.get("data", {}) for d in by_kind(docs, "ConfigMap")}
    env: dict[str, str] = {}
    for ref in container.get("envFrom", []):
        if "configMapRef" in ref:
            env.update(maps[ref["configMapRef"]["name"]])
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    return env


def _serves_http_in_process(command: list[str]) -> bool:
    """`sluice serve`, or `sluice worker --engine transformers` (a gateway serving its model)."""
    return command[:2] == ["sluice", "serve"] or command[:4] == ["sluice", "worker", "--engine", "transformers"]


def _shutdown_bound_s(docs: list[Obj], template: Obj) -> float:
    """The longest a pod of `template` takes to stop on SIGTERM, preStop included."""
    container = template["spec"]["containers"][0]
    command = container.get("command", [])
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    if _serves_http_in_process(command):
        assert pre_stop > 0, "a server needs a preStop pause, so endpoints drop it before its drain"
        env = _env(docs, container)
        settings = Settings.model_fields
        drain_s = float(env.get("SLUICE_DRAIN_TIMEOUT_S", settings["drain_timeout_s"].default))
        assert int(env.get("SLUICE_FRONTENDS", "1")) == 1, "--frontends stops differently: extend this bound"
        uvicorn_s = _source_number(server, r"timeout_graceful_shutdown=(\d+)")
        return pre_stop + drain_s + server._AFTER_DEADLINE_S + uvicorn_s
    # `sluice worker --engine vllm|trtllm` (directly, or at the end of a LeaderWorkerSet's leader.sh):
    # the registration keeper ends its call in flight and deregisters (two gateway calls at most),
    # then the engine gets stop_timeout_s.
    stop_s = WorkerSpec.__dataclass_fields__["stop_timeout_s"].default
    return float(pre_stop + 2 * registration.HTTP_TIMEOUT_S + stop_s)


def _runs_sluice_worker(owner: str, container: Obj) -> bool:
    """`sluice worker` as the command, or a LeaderWorkerSet leader (its leader.sh ends in it)."""
    return container.get("command", [])[:2] == ["sluice", "worker"] or owner.endswith("/leaderTemplate")


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_grace_period_covers_prestop_drain_and_shutdown(name: str) -> None:
    docs = overlay_docs(name)
    checked = []
    for owner, template in templates(docs).items():
        container = template["spec"]["containers"][0]
        if not (_serves_http_in_process(container.get("command", [])) or _runs_sluice_worker(owner, container)):
            continue
        grace = template["spec"].get("terminationGracePeriodSeconds", 30)  # 30: Kubernetes' default
        bound = _shutdown_bound_s(docs, template)
        assert grace >= bound, f"{owner}: terminationGracePeriodSeconds {grace} < {bound} s to stop"
        checked.append(owner)
    assert "sluice-gateway" in checked and len(checked) >= 2, checked


@pytest.mark.parametrize("name", OVERLAYS)
def test_no_fixed_replicas_where_an_hpa_owns_the_count(name: str) -> None:
    docs = overlay_docs(name)
    hpas = by_kind(docs, "HorizontalPodAutoscaler")
    assert hpas
    for hpa in hpas:
        target = hpa["spec"]["scaleTargetRef"]
        owned = next(d for d in by_kind(docs, target["kind"]) if d["metadata"]["name"] == target["name"])
        assert "replicas" not in owned["spec"], f"{target['name']}: every apply would reset the HPA's count"


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_gateway_reads_api_keys_from_a_secret_it_cannot_start_without(name: str) -> None:
    """With no API key the gateway serves inference to anyone: the keys file comes from the Secret
    sluice-api-keys, a required volume, so a gateway without it never starts."""
    docs = overlay_docs(name)
    template = templates(docs)["sluice-gateway"]
    container = template["spec"]["containers"][0]
    env = _env(docs, container)
    assert "SLUICE_API_KEYS" not in env  # never in a ConfigMap
    path = env["SLUICE_API_KEYS_FILE"]
    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/"))
    volume = next(v for v in template["spec"]["volumes"] if v["name"] == mount["name"])
    secret = volume["secret"]
    assert secret["secretName"] == "sluice-api-keys" and not secret.get("optional", False)
    relative = path[len(mount["mountPath"].rstrip("/")) + 1:]
    assert {"key": "keys.yaml", "path": relative} in secret["items"]  # a Secret without the key fails the mount


def _startup_limit_s(command: list[str]) -> float:
    assert "--startup-timeout-s" in command, f"pass the start-up limit explicitly: {command}"
    return float(command[command.index("--startup-timeout-s") + 1])


def _probe_budget_s(container: Obj) -> float:
    probe = container["startupProbe"]
    tries, period_s = probe.get("failureThreshold", 3), probe.get("periodSeconds", 10)
    return float(probe.get("initialDelaySeconds", 0) + tries * period_s)


@pytest.mark.parametrize("name", OVERLAYS)
def test_startup_probes_agree_with_the_launchers_limit(name: str) -> None:
    """`sluice worker` gives up on an engine that is not healthy after --startup-timeout-s (15 min by
    default): the start-up probe must not kill it sooner, nor wait long after it gave up. A
    LeaderWorkerSet's leader first waits for the other nodes, for at most NODE_WAIT_S."""
    docs = overlay_docs(name)
    checked = 0
    for owner, template in templates(docs).items():
        for container in template["spec"]["containers"]:
            command = container.get("command", [])
            if command[:2] == ["sluice", "worker"] and "transformers" not in command:
                limit = _startup_limit_s(command)
            elif owner.endswith("/leaderTemplate"):
                script = next(d["data"]["leader.sh"] for d in by_kind(docs, "ConfigMap")
                              if "leader.sh" in d.get("data", {}))
                exec_line = script[script.index("exec sluice worker"):]
                wait = re.search(r"^NODE_WAIT_S=(\d+)", script, re.M)
                assert wait, "the leader's wait for the other nodes must be bounded by NODE_WAIT_S"
                limit = _startup_limit_s(exec_line.replace("\\\n", " ").split()) + float(wait.group(1))
            else:
                continue
            budget = _probe_budget_s(container)
            assert limit <= budget <= limit + PROBE_SLACK_S, f"{owner}: probe {budget} s against a {limit} s limit"
            checked += 1
    assert checked or name == "cpu-dev"
