"""The tests mirror the packages: every package of the product has its own test folder.

The rule, for every directory with an `__init__.py` under gateway/, router/ and engines/, at
any depth (a sub-package such as engines/classic/execution/backends/ too, not only its parent):
tests/<the same path>/ exists and is a package itself (an `__init__.py`, so that test modules
of the same name in two folders do not clash); if the package has modules of its own (besides
`__init__.py` and `__main__.py`), its folder holds at least one test module, while a package that
only groups sub-packages (engines/sim/) needs just the folder around theirs. A newcomer who opens a
module then knows where its tests are, and a package that moves leaves a folder to move with it.
Conversely every folder under tests/gateway, tests/router and tests/engines mirrors a package
that exists, so a stale folder is noticed.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP = ("gateway", "router", "engines")


def _packages() -> list[Path]:
    return sorted(init.parent.relative_to(ROOT) for top in TOP for init in (ROOT / top).rglob("__init__.py")
                  if "__pycache__" not in init.parts)


def _has_modules(package: Path) -> bool:
    return any(m.name not in ("__init__.py", "__main__.py") for m in (ROOT / package).glob("*.py"))


def test_every_package_has_a_test_folder_with_tests() -> None:
    missing = []
    for package in _packages():
        folder = ROOT / "tests" / package
        if not (folder / "__init__.py").is_file() or (_has_modules(package) and not any(folder.glob("test_*.py"))):
            missing.append(f"tests/{package}/")
    assert not missing, f"packages without a test folder holding tests: {missing}"


def test_every_test_folder_mirrors_a_package() -> None:
    packages = set(_packages())
    stale = [str(folder.relative_to(ROOT)) for top in TOP for folder in (ROOT / "tests" / top).rglob("*")
             if folder.is_dir() and folder.name != "__pycache__"
             and folder.relative_to(ROOT / "tests") not in packages]
    assert not stale, f"test folders with no package of that path: {stale}"
