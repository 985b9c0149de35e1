"""SIGTERM and SIGINT for the workers and the command line: :func:`stop_signals`."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["stop_signals"]


@contextmanager
def stop_signals(on_signal: Callable[[int], None]) -> Iterator[bool]:
    """While inside, SIGTERM and SIGINT call ``on_signal(signum)`` (with :func:`signal.signal`);
    the previous handlers are restored on exit. Only the main thread can install signal handlers:
    elsewhere nothing is installed. Yields whether the handlers were installed.

    ``on_signal`` runs in the main thread between two Python instructions of whatever it was doing,
    so it must not block nor take a lock that code may hold (set a flag, write to a socket)."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        on_signal(signum)

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield True
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
