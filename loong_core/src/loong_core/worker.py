"""``python -m loong_core.worker [overrides]``: one rank of a torchrun job started by ``loong train``."""

from __future__ import annotations

import logging
import signal
import sys


def main() -> int:
    """Train with the overrides on the command line; exit code 2 on a loong error."""
    from loong_core.errors import LoongError
    from loong_core.logs import quiet_third_party
    from loong_core.reaper import die_with_parent
    from loong_core.runtime import train_or_explain

    die_with_parent()  # torchrun starts workers in sessions of their own: end with the launcher
    # The launcher forwards SIGINT when it gets one: end at once, even inside a collective, as
    # on SIGTERM (the reaper then ends this rank's helper processes).
    signal.signal(signal.SIGINT, signal.SIG_DFL)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    quiet_third_party()
    try:
        train_or_explain(sys.argv[1:])
    except LoongError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        from loong_core.lost_peer import lost_peer_message

        message = lost_peer_message(exc)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    code = main()
    if code == 0:  # the run's files are complete and closed: skip the interpreter's teardown
        from loong_core.quick_exit import exit_without_teardown

        exit_without_teardown()
    sys.exit(code)
