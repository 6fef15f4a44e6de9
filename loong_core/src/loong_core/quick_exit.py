"""End a process that has succeeded without the interpreter's module teardown.

With torch, megatron-core and the loong plugins imported, tearing the modules down takes about a
second of CPU per process (every rank of every run), longer than some whole commands. A command
that has finished its work (``loong train``, each of its ranks, ``loong convert``) ends through
:func:`exit_without_teardown` instead: what the interpreter does before the teardown still runs
(threads joined, then the exit handlers libraries registered: worker processes joined, log handlers
flushed), stdout and stderr are flushed, and the process exits with status 0. A failing command
exits the ordinary way. Code running inside such a command (a plugin's hooks) closes or flushes
the files it writes before the command returns, or registers an :mod:`atexit` handler that does.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading


def exit_without_teardown() -> None:
    """End the process with status 0 after joining its threads and running its exit handlers."""
    getattr(threading, "_shutdown", lambda: None)()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
