"""Model files sent with a repository load (`file:<path>` parameters), written so a failure leaves nothing half-done.

`replace_files(model_dir, files)` builds the model's next directory beside the
current one, in a hidden `.upload-*` directory that repository scans skip: the
current files hard-linked (copied where linking fails, symlinks kept as symlinks),
then each sent file written in place of its link. Every path is checked to stay
inside the directory, symlinks resolved, before anything is written. The staged
directory is then renamed in under the model's name, the old one kept aside;
`commit()` deletes the old one once the model loaded, `rollback()` puts it back
when the load failed. Between the two renames the model's name is briefly absent;
a crash there leaves the old files in `.replaced-*`, never a partial mix.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from engines.classic.errors import invalid


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def check_paths(files: dict[str, bytes]) -> None:
    """Refuse, before any write, a path that is empty, absolute, or has NUL, a backslash or a '..' part."""
    for rel in files:
        parts = rel.split("/")
        if not rel or "\0" in rel or "\\" in rel or os.path.isabs(rel) or ".." in parts:
            raise invalid(f"file parameter 'file:{rel[:200]}' must name a path inside the model directory")


def _write(root: Path, files: dict[str, bytes]) -> None:
    real_root = root.resolve()
    for rel, content in files.items():
        target = root / rel
        resolved = target.resolve()
        if not resolved.is_relative_to(real_root) or resolved == real_root:
            raise invalid(f"file parameter 'file:{rel[:200]}' must name a path inside the model directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir() and not target.is_symlink():
            raise invalid(f"file parameter 'file:{rel[:200]}' names a directory")
        target.unlink(missing_ok=True)  # a hard link to the current file: never write through it
        target.write_bytes(content)


@dataclass(slots=True)
class Staged:
    model_dir: Path
    aside: Path | None  # the previous directory, until commit or rollback

    def commit(self) -> None:
        if self.aside is not None:
            shutil.rmtree(self.aside, ignore_errors=True)
            self.aside = None

    def rollback(self) -> None:
        failed = self.model_dir.with_name(f".failed-{self.model_dir.name}-{secrets.token_hex(4)}")
        with contextlib.suppress(FileNotFoundError):
            os.rename(self.model_dir, failed)
        if self.aside is not None:
            os.rename(self.aside, self.model_dir)
            self.aside = None
        shutil.rmtree(failed, ignore_errors=True)


def replace_files(model_dir: Path, files: dict[str, bytes]) -> Staged:
    """Put `files` into `model_dir` as one change (see the module docstring); raises InferError for a bad path."""
    check_paths(files)
    token = secrets.token_hex(4)
    staging = model_dir.with_name(f".upload-{model_dir.name}-{token}")
    try:
        if model_dir.is_dir():
            shutil.copytree(model_dir, staging, symlinks=True, copy_function=_link_or_copy)
        else:
            staging.mkdir()
        _write(staging, files)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    aside = None
    if model_dir.is_dir():
        aside = model_dir.with_name(f".replaced-{model_dir.name}-{token}")
        os.rename(model_dir, aside)
    os.rename(staging, model_dir)
    return Staged(model_dir, aside)
