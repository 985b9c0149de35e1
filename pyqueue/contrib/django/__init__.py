"""The Django Tasks backend of pyqueue (extra ``pgdelayq[django]``; docs/django.md).

Add ``"pyqueue.contrib.django"`` to ``INSTALLED_APPS`` (it owns the results table) and name the backend in
``TASKS``::

    TASKS = {"default": {"BACKEND": "pyqueue.contrib.django.DelayedQueueBackend", "QUEUES": ["default"]}}

The backend works with Django 6's ``django.tasks`` and with the ``django-tasks`` backport on Django 5.2
(:mod:`pyqueue.contrib.django.compat` imports whichever is present). Importing this package imports
neither Django's models nor the backend until ``DelayedQueueBackend`` is asked for, so it is safe to
list in ``INSTALLED_APPS``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DelayedQueueBackend", "enqueue_with_id"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
