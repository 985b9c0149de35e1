"""Fixtures of the Django tests: a real Django project (tests/django/project: settings, manage.py, the
app ``tasksapp`` with its tasks) set up once per session, on a real database of the test server.

* ``django_template``: a copy of the installed pyqueue template with the project's migrations applied
  (``manage.py migrate``'s work, done once) and the table ``tasks_log`` the tasks write to.
* ``django_dsn``: a fresh copy of it for this test; Django's ``default`` database points at it, and
  ``PYQUEUE_DJANGO_DSN`` names it for the worker processes a test starts (their settings read it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import django
import pytest
from psycopg.conninfo import conninfo_to_dict

from pyqueue import testing

PROJECT_DIR = Path(__file__).resolve().parent / "project"
sys.path.insert(0, str(PROJECT_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402

TASKS_LOG = "CREATE TABLE tasks_log (id bigserial PRIMARY KEY, name text, value text, pid int)"


def point_django_at(dsn: str) -> None:
    """Close every Django connection of this thread and point the ``default`` database at ``dsn``
    (the settings dict is shared by the connections of every thread, made afresh after this)."""
    connections.close_all()
    params = conninfo_to_dict(dsn)
    db = settings.DATABASES["default"]
    db.update(NAME=params.get("dbname", ""), USER=params.get("user", ""), PASSWORD=params.get("password", ""),
              HOST=params.get("host", ""), PORT=params.get("port", ""))
    connections["default"].settings_dict.update(db)
    os.environ["PYQUEUE_DJANGO_DSN"] = dsn


@pytest.fixture(scope="session")
def django_template(admin_dsn: str, template_dsn: str) -> Iterator[str]:
    """The name of a database with pyqueue installed and the project migrated."""
    name = f"dq_django_template_{os.getpid()}"
    testing.drop_database(admin_dsn, name)
    dsn = testing.clone_database(admin_dsn, str(conninfo_to_dict(template_dsn)["dbname"]), name)
    point_django_at(dsn)
    call_command("migrate", verbosity=0)
    with connections["default"].cursor() as cur:
        cur.execute(TASKS_LOG)
    connections.close_all()
    yield name
    connections.close_all()
    testing.drop_database(admin_dsn, name)


@pytest.fixture
def django_dsn(admin_dsn: str, django_template: str) -> Iterator[str]:
    """A fresh copy of ``django_template`` for this test, Django's ``default`` database."""
    dsn = testing.clone_database(admin_dsn, django_template)
    point_django_at(dsn)
    yield dsn
    connections.close_all()
    testing.drop_database(admin_dsn, str(conninfo_to_dict(dsn)["dbname"]))
