"""Integrations with frameworks: :mod:`pyqueue.contrib.asgi` (Starlette, FastAPI and any ASGI server's
lifespan)."""
