"""The Django settings of bench.django_worker: one database (the libpq connection string in the
environment variable PYQUEUE_DJANGO_DSN, where pyqueue is installed), two Tasks backends on it,

* ``default``: ours, ``pyqueue.contrib.django.DelayedQueueBackend`` (run by ``pyqueue_worker``);
* ``database``: Django's reference, ``django_tasks_db.DatabaseBackend`` (run by ``db_worker``);

and the tasks of :mod:`bench.django_worker_tasks`. ``CONN_MAX_AGE`` is Django's default (0) unless
BENCH_DJANGO_CONN_MAX_AGE sets it (seconds; "none": persistent connections). No logging is
configured: neither worker writes a line per task."""

import os

from psycopg.conninfo import conninfo_to_dict

_dsn = conninfo_to_dict(os.environ.get("PYQUEUE_DJANGO_DSN", "dbname=pyqueue_django_unset"))
_age = os.environ.get("BENCH_DJANGO_CONN_MAX_AGE", "0")

SECRET_KEY = "bench-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_tasks",
    "django_tasks_db",
    "pyqueue.contrib.django",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _dsn.get("dbname", ""),
        "USER": _dsn.get("user", ""),
        "PASSWORD": _dsn.get("password", ""),
        "HOST": _dsn.get("host", ""),
        "PORT": _dsn.get("port", ""),
        "CONN_MAX_AGE": None if _age == "none" else int(_age),
    }
}

TASKS = {
    "default": {"BACKEND": "pyqueue.contrib.django.DelayedQueueBackend", "QUEUES": []},
    "database": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": []},
}
