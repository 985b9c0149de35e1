"""The web console (extra ``pgdelayq[console]``): queues, messages, dead letters with redrive,
schedules, table health and an audit log, served by ``pyqueue console`` or mounted in a
Starlette/FastAPI application with :func:`create_app`. See docs/console.md."""

from .app import create_app
from .security import ACTIONS, Credentials

__all__ = ["ACTIONS", "Credentials", "create_app"]
