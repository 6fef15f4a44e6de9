"""No process of a run outlives it: workers die with their launcher, helpers with their worker.

- :func:`die_with_parent`: a torchrun worker asks the kernel for SIGKILL when its parent (the
  ``loong train`` process) dies, so killing the launcher, or its process group, ends the workers
  even though torchrun starts them in sessions of their own.
- :class:`Reaper`: a small watcher process (``python -m loong_core.reaper PID``) that remembers
  the descendants of a training process (megatron-core's checkpoint-writer workers, Python's
  resource tracker, data-loader workers) and kills them when that process dies without cleaning up
  (SIGKILL, the OOM killer). It exits when the process does, or when :meth:`Reaper.stop` is called.

Linux only (``/proc`` and ``prctl``); elsewhere both are no-ops.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import subprocess
import sys
import time

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_POLL = 0.25


def die_with_parent() -> None:
    """SIGKILL this process when its parent exits (Linux ``prctl(PR_SET_PDEATHSIG)``)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


def name_this_process(name: str) -> None:
    """Give this process the name ``ps``, ``top`` and ``/proc/PID/comm`` show (Linux ``prctl``).

    Args:
        name: At most 15 bytes are kept (the kernel's limit).
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        return


def _process_table() -> dict[int, tuple[int, str, int]]:
    """``pid -> (parent pid, start time, process group)`` of every process (``/proc/*/stat``)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(entry)] = (int(fields[1]), fields[19], int(fields[2]))  # ppid, starttime, pgrp
    return table


def descendants(pid: int, table: dict | None = None) -> dict[int, str]:
    """``pid -> start time`` of every descendant of ``pid`` alive now."""
    table = _process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for child, (parent, *_) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = {}, list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        if child not in found:
            found[child] = table[child][1]
            todo.extend(children.get(child, ()))
    return found


def _stays_alive(pid: int, seconds: float = 0.5) -> bool:
    """Whether ``pid`` (this process's parent) is still alive, and not exiting, ``seconds`` on."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.getppid() != pid:
            return False
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return False
        except OSError:
            return False
        time.sleep(0.02)
    return True


def watch(pid: int) -> None:
    """Remember ``pid``'s descendants until it dies, then SIGKILL them (the loop of
    ``python -m loong_core.reaper PID``, a child of ``pid`` reading a pipe from it on stdin).

    Besides the remembered ones, the processes orphaned by the death are found and killed: those
    now under this watcher's new parent, in ``pid``'s process group and started after it (helpers
    forked in the last moments, such as per-save checkpoint writers). The end of the pipe with
    ``pid`` still alive means a normal stop: nothing is killed. SIGINT and SIGTERM are ignored, so
    that a signal to the whole process group cannot end the watch before the helpers.
    """
    me, seen = os.getpid(), {}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    first = _process_table()
    if pid not in first:
        return
    _, born, group = first[pid]
    while os.getppid() == pid:
        seen.update({child: start for child, start in descendants(pid).items() if child != me})
        if select.select([sys.stdin], [], [], _POLL)[0] and not sys.stdin.buffer.read1(1):
            # The pipe also ends when pid dies, a moment before this process is re-parented.
            if _stays_alive(pid):
                return  # stopped by Reaper.stop (which waits for this process to exit)
            break
    for _ in range(3):  # again, for grandchildren orphaned by the first kills
        table = _process_table()
        orphans = {child: start for child, (parent, start, pgrp) in table.items()
                   if parent == os.getppid() and pgrp == group and int(start) >= int(born) and child != me}
        alive = {child: start for child, start in {**seen, **orphans}.items()
                 if child in table and table[child][1] == start}  # the same process, not a reused pid
        if not alive:
            return
        for child in alive:
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)


class Reaper:
    """The watcher of this process (see the module docstring); a context manager."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None

    def start(self) -> Reaper:
        if sys.platform.startswith("linux") and os.path.isdir("/proc"):
            self.proc = subprocess.Popen([sys.executable, "-m", "loong_core.reaper", str(os.getpid())],
                                         stdin=subprocess.PIPE, close_fds=True)
        return self

    def stop(self) -> None:
        """End the watcher without killing anything (the run is ending normally)."""
        if self.proc is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None

    def __enter__(self) -> Reaper:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    watch(int(sys.argv[1]))
