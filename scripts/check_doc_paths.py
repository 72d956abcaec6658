"""Doc gate: every repository path and module that README.md and docs/*.md name must exist.

Run by `make lint`. Exits 1 and names every stale reference as `file:line: reference (why)`.

What is read: inline code spans, fenced code blocks and markdown link targets. Code is cut
into words at whitespace, `=` and commas outside braces; quotes, brackets and trailing
punctuation are trimmed, and a pytest node id loses its `::test` part. A word is checked when:

- it starts with a top-level directory or file of the repository (`ROOTS`: `gateway/...`,
  `engines/classic/`, `loadtests/...`, `Makefile`, `.ci/run`...): that path must exist;
- it is a relative path whose first part names a directory inside the code packages
  (`llm/params.py`, `backends/base.py`): some path in the tree must end with it;
- it is a bare `name.py`: some file of that name must exist;
- it is a dotted name starting with a package, in inline code (`gateway.llm.dispatch`,
  `router.Router.rank`; in a code block, `router.start()` is a variable's method): the longest
  prefix that names a module or package must be followed by nothing, or by an attribute whose
  first name occurs in that module's source (a package's: in its `__init__.py`);
- it is a link target (not a URL, not an anchor alone): the file, relative to the document.

Skipped: URLs (`scheme://`), absolute paths and URL paths (`/v1/models`), glob patterns
(`*`, `?`), placeholders (`<...>`, `{name}`; `{a,b}` lists are expanded and each checked),
home or environment paths (`~`, `$SLUICE_CACHE`, `$OUT`), and outputs written at run time:
a path that .gitignore covers (`tests/artifacts/`, the model files `make models` builds).
"""

from __future__ import annotations

import fnmatch
import re
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("gateway", "router", "engines", "loadtests", "deploy", "tests", "scripts", "model_repository",
         "docs", "examples", ".ci", "Makefile", "README.md", "pyproject.toml")
PACKAGES = ("gateway", "router", "engines", "loadtests", "tests", "model_repository", "scripts")
CODE_DIRS = ("gateway", "router", "engines")  # where a shorthand's first directory is looked up
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_INLINE = re.compile(r"(`+)(.+?)\1", re.S)
_LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_DOTTED = re.compile(r"(?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+")
_SKIP = ("://", "*", "?", "<", ">", "$", "~", "…", "[")
_TRIM = "\"'`()[],;:.!"
_FILE_SUFFIXES = (".py", ".md", ".json", ".yaml", ".yml", ".sh", ".txt", ".toml", ".png", ".pbtxt")


def documents(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def references(text: str) -> Iterator[tuple[int, str, str]]:
    """(line, word, kind) for every candidate word of a markdown text; kind: link, fence or inline."""
    for m in _LINK.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1), "link"
    spans: list[tuple[int, str, str]] = []  # (line of the span's start, span, kind)
    for m in _FENCE.finditer(text):
        spans.append((text.count("\n", 0, m.start(1)) + 1, m.group(1), "fence"))
    prose = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # keeps line numbers
    for m in _INLINE.finditer(prose):
        spans.append((prose.count("\n", 0, m.start(2)) + 1, m.group(2), "inline"))
    for first_line, span, kind in spans:
        for m in re.finditer(r"[^\s=]+", span):
            for word in re.split(r",(?![^{]*\})", m.group(0)):
                line = first_line + span.count("\n", 0, m.start())
                yield line, word.split("::")[0].lstrip("\"'`([").rstrip(_TRIM), kind


def expand(word: str) -> list[str]:
    """`a/{b,c}.py` -> `a/b.py`, `a/c.py`; a brace without a comma is a placeholder (no words)."""
    m = re.search(r"\{([^{}]*)\}", word)
    if m is None:
        return [word]
    if "," not in m.group(1):
        return []
    return [w for alt in m.group(1).split(",") for w in expand(word[:m.start()] + alt + word[m.end():])]


class Tree:
    def __init__(self, root: Path) -> None:
        self.root = root
        files = [p for d in ROOTS if (root / d).is_dir() for p in (root / d).rglob("*")
                 if "__pycache__" not in p.parts and ".venv" not in p.parts]
        self.paths = {p.relative_to(root).as_posix() for p in files}
        self.names = {Path(p).name for p in self.paths}
        self.code_dirs = {p.name for d in CODE_DIRS for p in (root / d).rglob("*") if p.is_dir()} - {"__pycache__"}
        self.ignored = [line.strip() for line in (root / ".gitignore").read_text().splitlines()
                        if line.strip() and not line.startswith("#")]

    def is_ignored(self, path: str) -> bool:
        parts = path.rstrip("/").split("/")
        for pattern in self.ignored:
            anchored = "/" in pattern.rstrip("/")
            pat = pattern.strip("/")
            for i in range(1, len(parts) + 1):
                if anchored and fnmatch.fnmatch("/".join(parts[:i]), pat):
                    return True
                if not anchored and fnmatch.fnmatch(parts[i - 1], pat):
                    return True
        return False

    def exists(self, path: str) -> bool:
        return (self.root / path).exists() or self.is_ignored(path)

    def module(self, dotted: str) -> str | None:
        """Why `dotted` does not resolve, or None."""
        parts = dotted.split(".")
        found: Path | None = None
        for i in range(1, len(parts) + 1):
            base = self.root.joinpath(*parts[:i])
            if base.with_suffix(".py").is_file():
                found, rest = base.with_suffix(".py"), parts[i:]
                break
            if not base.is_dir():
                break
            found, rest = base, parts[i:]
        if found is None:
            return "no such module"
        if not rest:
            return None
        source = found if found.is_file() else found / "__init__.py"
        if source.is_file() and re.search(rf"\b{re.escape(rest[0])}\b", source.read_text()):
            return None
        where = source.relative_to(self.root).as_posix()
        return f"no module {'.'.join(parts[:len(parts) - len(rest) + 1])}, and `{rest[0]}` is not in {where}"


def problem(tree: Tree, doc: Path, word: str, kind: str) -> str | None:
    """Why `word` (named in `doc`) is stale, or None when it exists or is not checked."""
    if kind == "link":
        target = word.split("#")[0]
        if not target or "://" in target or target.startswith(("mailto:", "/")):
            return None
        path = (doc.parent / target).resolve()
        if not path.is_relative_to(tree.root):
            return None
        return None if tree.exists(path.relative_to(tree.root).as_posix()) else "no such file"
    word = word.split("#")[0]
    if not word or word.startswith("/") or any(s in word for s in _SKIP):
        return None
    if _DOTTED.fullmatch(word) and not word.endswith(_FILE_SUFFIXES):
        # In a code block `router.start()` is a variable's method, not a module.
        return tree.module(word) if kind == "inline" else None
    first = word.split("/")[0]
    if first in ROOTS and (first == word or "/" in word):
        return None if tree.exists(word) else "no such path"
    if "/" in word and first in tree.code_dirs:
        tail = "/" + word.rstrip("/")
        return None if any(("/" + p).endswith(tail) for p in tree.paths) else "no path ends with it"
    if "/" not in word and re.fullmatch(r"\w+\.py", word):
        return None if word in tree.names else "no file of that name"
    return None


def stale(root: Path) -> list[str]:
    tree = Tree(root)
    out = []
    for doc in documents(root):
        for line, raw, kind in sorted(references(doc.read_text())):
            for word in expand(raw) if kind != "link" else [raw]:
                why = problem(tree, doc, word, kind)
                if why is not None:
                    out.append(f"{doc.relative_to(root)}:{line}: {word} ({why})")
    return out


def main() -> int:
    found = stale(REPO)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
