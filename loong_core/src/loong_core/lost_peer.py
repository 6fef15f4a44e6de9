"""Name the node a rank lost contact with, instead of gloo's "Connection reset by peer".

When a machine of a multi-node run dies (or its ``loong train`` is killed: its workers die with
it), the ranks of the other machines fail in their next collective with a transport error that
names only the peer's address. :func:`lost_peer_message` turns that error into one line naming
the lost host and this node, and saying how to continue.
"""

from __future__ import annotations

import os
import re
import socket

# gloo: "Read error [10.0.0.2]:34950: Connection reset by peer", "Connection closed by peer
# [10.0.0.2]:34950"; NCCL: "... remote process exited or there was a network error".
_PEER = re.compile(r"\[(?P<host>[^\]]+)\]:(?P<port>\d+)")
_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
         "remote process exited")


def lost_peer_message(exc: BaseException) -> str | None:
    """One-line explanation when ``exc`` is a collective that failed because a peer went away.

    Args:
        exc: The exception a training rank raised.

    Returns:
        The message, or None when ``exc`` is not a lost peer.
    """
    text = str(exc)
    if not isinstance(exc, RuntimeError) or not any(mark in text for mark in _LOST):
        return None
    match = _PEER.search(text)
    peer = f"the rank at {match.group('host')}:{match.group('port')}" if match else "a rank"
    here = (f"node {os.environ.get('GROUP_RANK', '?')} ({socket.gethostname()}), rank "
            f"{os.environ.get('RANK', '?')}")
    return (f"lost contact with {peer} in a collective: that rank's node died, its 'loong train' "
            f"was killed, or the network between the nodes failed; {here} stops too. Relaunch "
            "every node with trainer.resume=auto to continue from the newest complete checkpoint.")
