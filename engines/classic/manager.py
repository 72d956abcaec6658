"""ModelRepositoryManager: loads a Triton-layout repository and serves inferences on it.

Entry points used by the gateway (and by BLS calls and ensembles):

- `await start()` / `await stop()`; `ready()` is True once the start-up loads
  have been attempted (a model that failed to load is UNAVAILABLE with its
  reason; the others serve).
- `await infer(model_name, version, inputs, outputs=None, priority=0,
  timeout_us=0, parameters=None, request_id="") -> dict[str, np.ndarray]`:
  inputs/outputs are numpy arrays by tensor name, BYTES as object arrays of
  `bytes` (str/bytes arrays are accepted). `version` "" (or None) means the
  latest ready version. Raises `InferError` whose `.kind` maps to the protocol
  status (NOT_FOUND, INVALID_ARG, UNAVAILABLE for a full queue or a timeout...).
  The KServe edges look a model up once (`get_version`) and run on it (`ModelVersion.infer`).
- Repository extension: `repository_index()`, `await load(name, config_json, files)`,
  `await unload(name)`, in "explicit" control mode; `files` (code sent) only with `allow_uploads`.
- Every entry point refuses a name that is not a plain model name (`names.py`).
- `llm_model_configs()`: models with backend "llm", served by the LLM path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from engines.classic.errors import ConfigError, InferError, invalid, not_found, unavailable
from engines.classic.execution.rate_limiter import RateLimiter
from engines.classic.limits import ClassicLimits
from engines.classic.loading import ModelEntry, load_versions, parse_override, read_config
from engines.classic.model import ModelVersion
from engines.classic.proto import ModelConfig
from engines.classic.repository import disk as repo
from engines.classic.repository import uploads
from engines.classic.repository.names import check_model_name
from engines.classic.request import InferRequest
from engines.classic.scheduling.ensemble import step_models
from engines.classic.stats import StatsSnapshot
from engines.errors import ErrorKind
from engines.supervision import QUICK_BACKOFF, BackgroundTask

log = logging.getLogger("sluice.classic")
CONTROL_MODES = ("none", "explicit", "poll")


class ModelRepositoryManager:
    def __init__(self, repo_dir: Path, control_mode: str = "none", startup_models: Iterable[str] = (),
                 poll_interval_s: float = 15.0, limits: ClassicLimits | None = None,
                 allow_uploads: bool = False) -> None:
        if control_mode not in CONTROL_MODES:
            raise ValueError(f"control_mode must be one of {CONTROL_MODES}, got '{control_mode}'")
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s}")
        self.repo_dir = Path(repo_dir)
        self.control_mode = control_mode
        self.startup_models = list(startup_models)
        self.poll_interval_s = poll_interval_s
        self.limits = limits or ClassicLimits()
        self.rate_limiter = RateLimiter(dict(self.limits.rate_limit_resources)) if self.limits.rate_limit else None
        # A load's `file:` parameters are code the client sent, run at load: only when the operator opts in.
        self.allow_uploads = allow_uploads
        self._uploading = asyncio.Lock()  # one upload (stage, load, commit or roll back) at a time
        self.loop: asyncio.AbstractEventLoop | None = None  # BLS calls from worker threads land here
        self._models: dict[str, ModelEntry] = {}
        self._llm: dict[str, ModelConfig] = {}
        self._ready = False
        self._poller = BackgroundTask("repository poller", self._poll_forever, backoff=QUICK_BACKOFF)

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        if self.control_mode == "explicit":
            names = list(repo.model_dirs(self.repo_dir)) if "*" in self.startup_models else self.startup_models
        else:
            names = list(repo.model_dirs(self.repo_dir))
        await self._load_many(names)
        if self.control_mode == "poll":
            self._poller.start()
        self._ready = True

    async def stop(self) -> None:
        self._ready = False
        await self._poller.stop()
        for entry in list(self._models.values()):
            await self._close_versions(entry)

    def ready(self) -> bool:
        return self._ready

    # ---- inference -------------------------------------------------------------------------
    async def infer(self, model_name: str, version: str | int | None, inputs: dict[str, np.ndarray],
                    outputs: list[str] | None = None, priority: int = 0, timeout_us: int = 0,
                    parameters: dict[str, Any] | None = None, request_id: str = "") -> dict[str, np.ndarray]:
        model = self.get_version(model_name, version)
        request = InferRequest(model_name, model.version, dict(inputs), outputs, priority, timeout_us, request_id,
                               dict(parameters or {}))
        return await model.infer(request)

    def get_version(self, name: str, version: str | int | None = None) -> ModelVersion:
        """The ready ModelVersion for (name, version); raises InferError NOT_FOUND / UNAVAILABLE / INVALID_ARG."""
        entry = self._models.get(check_model_name(name))
        if entry is None:
            if name in self._llm:
                raise invalid(f"model '{name}' is an LLM; use the generate endpoints")
            raise not_found(f"Request for unknown model: '{name}' is not found")
        if entry.state != "READY" or not entry.versions:
            why = f": {entry.reason}" if entry.reason else ""
            raise unavailable(f"Request for unknown model: '{name}' has no available versions{why}")
        version = "" if version in (None, -1, "-1") else str(version)
        if not version:
            return entry.versions[max(entry.versions, key=int)]
        if not version.isdigit():
            raise invalid(f"model version must be a positive integer, got '{version}'")
        found = entry.versions.get(str(int(version)))
        if found is None:
            raise not_found(f"Request for unknown model: '{name}' version {version} is not found")
        return found

    # ---- queries ---------------------------------------------------------------------------
    def model_ready(self, name: str, version: str | None = None) -> bool:
        try:
            self.get_version(name, version)
        except InferError:
            return False
        return True

    def model_config(self, name: str, version: str | None = None) -> ModelConfig:
        return self.get_version(name, version).config

    def llm_model_configs(self) -> dict[str, ModelConfig]:
        return dict(self._llm)

    def model_names(self) -> list[str]:
        return sorted(self._models)

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's index rows: name, version ('' when not loaded), state, reason."""
        rows: list[dict[str, str]] = []
        names = set(repo.model_dirs(self.repo_dir)) | set(self._models)
        for name in sorted(names - set(self._llm)):
            entry = self._models.get(name)
            if entry is not None and entry.state == "READY":
                rows += [{"name": name, "version": v, "state": "READY", "reason": ""}
                         for v in sorted(entry.versions, key=int)]
            elif not ready_only:
                state = entry.state if entry else "UNAVAILABLE"
                reason = entry.reason if entry else "unloaded"
                rows.append({"name": name, "version": "", "state": state, "reason": reason})
        return rows

    def statistics(self, name: str = "", version: str = "") -> list[StatsSnapshot]:
        """Stats of every ready version (or of one model/version; raises InferError when unknown)."""
        if name:
            if version:
                return [self.get_version(name, version).stats.snapshot()]
            self.get_version(name)  # raises for unknown / unavailable
            versions = self._models[name].versions
            return [versions[v].stats.snapshot() for v in sorted(versions, key=int)]
        return [e.versions[v].stats.snapshot() for e in self._models.values() if e.state == "READY"
                for v in sorted(e.versions, key=int)]

    # ---- repository extension --------------------------------------------------------------
    async def load(self, name: str, config_json: str | bytes | None = None,
                   files: dict[str, bytes] | None = None) -> None:
        """Load or reload a model; raises InferError with the reason when it fails.

        The override config is parsed and validated before anything is written; sent
        files are written as one change that a failed load rolls back (`uploads.py`).
        """
        check_model_name(name)
        self._require_explicit("load")
        if files and not self.allow_uploads:
            raise InferError(f"failed to load '{name}': model file uploads ('file:' parameters) are disabled on "
                             "this server (start it with --allow-model-uploads)", ErrorKind.PERMISSION_DENIED)
        model_dir = self.repo_dir / name
        override = parse_override(name, model_dir, config_json, files)
        if not files:
            if not model_dir.is_dir():
                raise not_found(f"failed to load '{name}': no model directory '{name}' in the repository")
            error = await self._load_one(name, override, visiting=set())
        else:
            async with self._uploading:
                staged = await asyncio.to_thread(uploads.replace_files, model_dir, files)
                try:
                    error = await self._load_one(name, override, visiting=set())
                except BaseException:
                    await asyncio.to_thread(staged.rollback)
                    raise
                await asyncio.to_thread(staged.commit if error is None else staged.rollback)
        if error is not None:
            raise invalid(f"failed to load '{name}': {error}")

    async def unload(self, name: str) -> None:
        check_model_name(name)
        self._require_explicit("unload")
        if name in self._llm:
            del self._llm[name]
            return
        entry = self._models.get(name)
        if entry is None:
            return  # Triton: unloading an unknown model is not an error
        async with entry.lock:
            await self._close_versions(entry)
            entry.state, entry.reason = "UNAVAILABLE", "unloaded"

    def _require_explicit(self, action: str) -> None:
        if self.control_mode != "explicit":
            raise unavailable(f"explicit model {action} is not allowed in model control mode "
                              f"'{self.control_mode}' (start with --model-control-mode explicit)")

    # ---- loading ---------------------------------------------------------------------------
    async def _load_many(self, names: Iterable[str]) -> None:
        for name in names:
            entry = self._models.get(name)
            if entry is not None and entry.state == "READY":
                continue  # already loaded as an ensemble's dependency
            await self._load_one(name, None, visiting=set())

    async def _load_one(self, name: str, override: ModelConfig | None, visiting: set[str]) -> str | None:
        """Load every selected version of `name`; returns why it failed, or None.

        A model that fails and had no version serving is UNAVAILABLE with the reason;
        a failed reload leaves the versions that serve in place, as Triton does.
        """
        if name in visiting:
            raise ConfigError(f"model '{name}': ensemble dependency cycle")
        visiting.add(name)
        entry = self._models.setdefault(name, ModelEntry(name))
        async with entry.lock:
            model_dir = self.repo_dir / name
            try:
                config = read_config(model_dir, override)
                if config.backend == "llm":
                    self._llm[name] = config
                    self._models.pop(name, None)
                    return None
                if config.backend == "ensemble":
                    await self._load_dependencies(config, visiting)
                loaded = await load_versions(config, model_dir, self, self.limits)
            except ConfigError as exc:
                self._failed(entry, model_dir, str(exc))
                return str(exc)
            old = entry.versions
            entry.versions, entry.config, entry.state, entry.reason = loaded, config, "READY", ""
            entry.fingerprint = repo.fingerprint(model_dir)
            for mv in old.values():  # in-flight requests on old versions finish first
                await mv.close()
            log.info("model %s loaded, versions %s", name, sorted(loaded, key=int))
            return None

    def _failed(self, entry: ModelEntry, model_dir: Path, reason: str) -> None:
        # Remember the files that failed, so poll mode retries only once they change.
        entry.fingerprint = repo.fingerprint(model_dir) if model_dir.is_dir() else ()
        if entry.state == "READY" and entry.versions:
            log.warning("model %s failed to reload, the loaded versions keep serving: %s", entry.name, reason)
            return
        log.warning("model %s failed to load: %s", entry.name, reason)
        entry.state, entry.reason, entry.config = "UNAVAILABLE", reason, None

    async def _load_dependencies(self, config: ModelConfig, visiting: set[str]) -> None:
        for dep in step_models(config):
            if dep in self._llm:
                continue
            entry = self._models.get(dep)
            if entry is None or entry.state != "READY":
                await self._load_one(dep, None, visiting)
            entry = self._models.get(dep)
            if entry is None or entry.state != "READY":
                why = entry.reason if entry else "not found"
                raise ConfigError(f"ensemble '{config.name}': composing model '{dep}' is not available: {why}")

    async def _close_versions(self, entry: ModelEntry) -> None:
        old, entry.versions = entry.versions, {}
        for mv in old.values():
            with contextlib.suppress(Exception):
                await mv.close()

    # ---- poll mode -------------------------------------------------------------------------
    async def _poll_forever(self) -> None:
        while True:  # a failing poll is logged and the loop restarted by its BackgroundTask
            await asyncio.sleep(self.poll_interval_s)
            await self.poll_once()

    async def poll_once(self) -> None:
        """Load new or changed models, unload removed ones."""
        on_disk = repo.model_dirs(self.repo_dir)
        for name, model_dir in on_disk.items():
            entry = self._models.get(name)
            if entry is None and name in self._llm:
                continue
            if entry is None or entry.fingerprint != repo.fingerprint(model_dir):
                await self._load_one(name, None, visiting=set())
        for name in [n for n in self._models if n not in on_disk]:
            entry = self._models.pop(name)
            await self._close_versions(entry)
