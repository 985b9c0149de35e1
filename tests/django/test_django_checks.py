"""Django's system checks of DelayedQueueBackend (``manage.py check``): the app that owns the results
table must be installed, as django-tasks-db's DatabaseBackend checks for its own app."""

from __future__ import annotations

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings
from django_tasks import task_backends


def test_no_error_when_the_app_is_installed() -> None:
    assert list(task_backends["default"].check()) == []
    call_command("check")  # the whole project, the framework's check of every backend included


def test_error_when_the_app_is_missing() -> None:
    with override_settings(INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_tasks"]):
        errors = list(task_backends["default"].check())
        assert [(e.level, e.id) for e in errors] == [(checks.ERROR, "pyqueue_django.E001")]
        assert "'pyqueue.contrib.django'" in (errors[0].hint or "") and "TASKS['default']" in errors[0].msg
        with pytest.raises(SystemCheckError, match="pyqueue_django.E001"):
            call_command("check")
