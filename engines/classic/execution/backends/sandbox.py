"""What a python model's own process (`isolation: process`) may reach: its environment, its process
group, its user, and (with the stub's `harden_self`) who may look into it.

- `child_env`: an allow-list of the server's variables (locale, paths, thread counts, visible
  devices), never the rest: API, admin and worker keys, cloud credentials and tokens stay out
  because they are not on the list, whatever their name.
- The process leads a session of its own; `kill_tree` kills that whole process group, plus any
  descendant that left it while its parent lived, so a model's grandchildren end with it.
- `ModelUser` (`--python-model-user`): the process runs as that unprivileged user, with its own
  group and no supplementary groups. Only a server running as root can do that; `resolve_user`
  refuses otherwise, at start-up.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import signal
import time
from dataclasses import dataclass

ENV_ALLOWED = frozenset({
    "PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING", "PYTHONFAULTHANDLER",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
})
ENV_ALLOWED_PREFIXES = ("LC_",)


@dataclass(frozen=True, slots=True)
class ModelUser:
    name: str
    uid: int
    gid: int
    home: str


def resolve_user(name: str) -> ModelUser:
    """The user python model processes run as; ValueError (a start-up error) when it cannot be."""
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, OverflowError):
        raise ValueError(f"--python-model-user {name!r}: no such user") from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise ValueError(f"--python-model-user {name!r}: must be an unprivileged user, not uid/gid 0")
    if os.geteuid() != 0:
        raise ValueError(f"--python-model-user {name!r}: the server must run as root to start model processes "
                         f"as another user (it runs as uid {os.geteuid()})")
    return ModelUser(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def child_env(pythonpath: str, user: ModelUser | None) -> dict[str, str]:
    """The model process's environment: the allowed variables of the server's, and `pythonpath`."""
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOWED or k.startswith(ENV_ALLOWED_PREFIXES)}
    env["PYTHONPATH"] = pythonpath
    if user is not None:
        env.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
    return env


def exit_status(pid: int, timeout_s: float) -> int | None:
    """`pid`'s exit status once it has exited (negative: the signal that killed it), waiting at most
    `timeout_s`; None if it still runs. The child is left unreaped, so its id and process group stay
    reserved for `kill_tree` (a reaped leader's id could be reused by an unrelated process)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            return None
        if info is not None:
            return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def kill_tree(pid: int) -> None:
    """SIGKILL the process group `pid` leads, and descendants of `pid` that left it; `pid` must not be reaped yet."""
    strays = _descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # the group lives on while a member does: the id is not reused
    for stray in (pid, *strays):  # `pid` too, should it have moved to another group of its session
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(stray, signal.SIGKILL)


def _descendants(pid: int) -> list[int]:
    """Descendants of `pid` now (Linux /proc; elsewhere none)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, ()))
    return found


def harden_self() -> None:
    """In the model process, before model code runs (Linux; elsewhere nothing): not dumpable, so a process
    of the same uid (another model's) can neither ptrace it nor open its /proc fd, mem or map files; and no
    new privileges, so no setuid program it runs gains any."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    except (OSError, AttributeError):
        pass
