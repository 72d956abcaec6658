"""The on-disk model repository: model directories, version selection, change detection."""

from __future__ import annotations

import os
from pathlib import Path

from engines.classic.errors import ConfigError
from engines.classic.proto import ModelConfig


def model_dirs(repo_dir: Path) -> dict[str, Path]:
    """Every non-hidden subdirectory of the repository, by model name."""
    if not repo_dir.is_dir():
        return {}
    return {p.name: p for p in sorted(repo_dir.iterdir()) if p.is_dir() and not p.name.startswith((".", "_"))}


def available_versions(model_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) > 0)


def select_versions(config: ModelConfig, model_dir: Path) -> list[int]:
    """Apply version_policy (latest N by default, all, or specific) to the version directories."""
    source = model_dir / "config.pbtxt"
    found = available_versions(model_dir)
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        chosen = found
    elif which == "specific":
        missing = [v for v in policy.specific.versions if v not in found]
        if missing:
            raise ConfigError(f"{source}: field 'version_policy.specific.versions': version(s) {missing} have "
                              f"no directory under {model_dir}")
        chosen = sorted(policy.specific.versions)
    else:
        count = policy.latest.num_versions if which == "latest" else 1
        if count < 1:
            raise ConfigError(f"{source}: field 'version_policy.latest.num_versions': must be >= 1")
        chosen = found[-count:]
    if not chosen:
        raise ConfigError(f"{source}: at least one version must be available under the version policy of model "
                          f"'{model_dir.name}' (no numeric version directory found)")
    return chosen


def fingerprint(model_dir: Path) -> tuple[tuple[str, int, int], ...]:
    """(relative path, mtime_ns, size) of every file: poll mode reloads a model when this changes."""
    entries = []
    for root, dirs, files in os.walk(model_dir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            path = Path(root) / name
            try:
                st = path.stat()
            except OSError:
                continue
            entries.append((str(path.relative_to(model_dir)), st.st_mtime_ns, st.st_size))
    return tuple(sorted(entries))

