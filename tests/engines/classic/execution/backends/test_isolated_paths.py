"""The isolated model process imports Sluice from the repository root, never from inside `engines/`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from engines.classic.execution.backends import isolated


def test_the_child_import_root_holds_the_engines_package() -> None:
    assert (isolated._ROOT / "engines" / "__init__.py").is_file()
    assert isolated._ROOT.name != "engines"


def test_a_model_importing_transformers_gets_the_library_not_engines_transformers(tmp_path: Path) -> None:
    """With `engines/` itself on the path, `engines/transformers/` would shadow the library."""
    code = "import importlib.util as u; print(u.find_spec('transformers').origin)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(isolated._ROOT), "PATH": "/usr/bin:/bin"}).stdout.strip()
    assert "site-packages" in out or "dist-packages" in out, out
    assert Path(out).resolve().parent.parent != isolated._ROOT / "engines"
