"""The Django app of :mod:`pyqueue.contrib.django`: it owns the task results table."""

from __future__ import annotations

from django.apps import AppConfig


class PyQueueDjangoConfig(AppConfig):
    """``INSTALLED_APPS = [..., "pyqueue.contrib.django"]``; app label ``pyqueue_django``."""

    name = "pyqueue.contrib.django"
    label = "pyqueue_django"
    verbose_name = "pyqueue tasks"
    default_auto_field = "django.db.models.BigAutoField"
