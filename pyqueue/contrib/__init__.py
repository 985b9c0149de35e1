"""Integrations with frameworks: :mod:`pyqueue.contrib.asgi` (a queue and its worker in a FastAPI or
Starlette lifespan; needs only Starlette) and :mod:`pyqueue.contrib.django` (a Django Tasks backend, extra
``pgdelayq[django]``). Nothing here is imported by ``import pyqueue``."""
