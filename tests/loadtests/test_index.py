"""loadtests/README.md is the index of the benchmarks: every script is listed in it, every path it
names exists, and every script finds the repository root from the folder it sits in."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOADTESTS = ROOT / "loadtests"
# The last section maps the names before issue 19, which no longer exist, to the current ones.
INDEX = (LOADTESTS / "README.md").read_text().split("## Names before issue 19")[0]
# Runs only in the KServe venv (scripts/ensure_kserve_venv.sh), where `kserve` is installed.
NOT_IMPORTABLE_HERE = {"classic/kserve_peer.py"}


def _modules() -> list[str]:
    return sorted(p.relative_to(LOADTESTS).as_posix() for p in LOADTESTS.rglob("*.py") if p.name != "__init__.py")


def test_every_script_and_helper_is_in_the_index() -> None:
    # routing/vtime/ is one package, indexed as a folder.
    missing = [m for m in _modules() if not m.startswith("routing/vtime/") and f"`{m}`" not in INDEX]
    assert not missing, f"not in loadtests/README.md: {missing}"
    assert "`routing/vtime/`" in INDEX


def test_every_path_the_index_names_exists() -> None:
    named = {w.strip("`") for w in re.findall(r"`[\w./-]+(?:\.py|/)`", INDEX)}
    named |= set(re.findall(r"\bloadtests/[\w/]+\.py\b", INDEX))  # the commands
    assert len(named) > 30, named
    stale = [w for w in sorted(named) if not (LOADTESTS / w).exists() and not (ROOT / w).exists()]
    assert not stale, f"loadtests/README.md names paths that do not exist: {stale}"


@pytest.mark.parametrize("module", [m for m in _modules() if m not in NOT_IMPORTABLE_HERE])
def test_each_module_imports_and_finds_the_repository_root(module: str) -> None:
    mod = importlib.import_module("loadtests." + module.removesuffix(".py").replace("/", "."))
    if hasattr(mod, "ROOT"):  # scripts put it on sys.path and write their reports under it
        assert Path(mod.ROOT) == ROOT, module
