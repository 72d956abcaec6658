"""Size gate for production code: modules of at most 300 lines, functions of at most 50.

Run by `make lint`. Counts physical lines, docstrings and comments included, as a
reader scrolling the file sees them. Exits 1 and names every offender.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 50
PACKAGES = ("gateway", "router", "engines")


def offenders(root: Path) -> list[str]:
    out: list[str] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            source = path.read_text()
            rel = path.relative_to(root)
            lines = source.count("\n") + (0 if source.endswith("\n") or not source else 1)
            if lines > MAX_MODULE_LINES:
                out.append(f"{rel}: {lines} lines (max {MAX_MODULE_LINES})")
            for node in ast.walk(ast.parse(source, str(rel))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                    length = (node.end_lineno or node.lineno) - start + 1
                    if length > MAX_FUNCTION_LINES:
                        out.append(f"{rel}:{node.lineno}: {node.name}() is {length} lines "
                                   f"(max {MAX_FUNCTION_LINES})")
    return out


def main() -> int:
    found = offenders(Path(__file__).resolve().parent.parent)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
