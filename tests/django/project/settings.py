"""A minimal Django project for the tests of pyqueue.contrib.django: its database is the one named by
the environment variable PYQUEUE_DJANGO_DSN (a libpq connection string of a database where pyqueue is
installed), so the pytest process and the worker processes it starts share one database."""

import os

from psycopg.conninfo import conninfo_to_dict

_dsn = conninfo_to_dict(os.environ.get("PYQUEUE_DJANGO_DSN", "dbname=pyqueue_django_unset"))

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["testserver", "localhost"]
ROOT_URLCONF = "urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_tasks",
    "pyqueue.contrib.django",
    "tasksapp",
]

# The admin (pyqueue.contrib.django.admin registers the task results).
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
STATIC_URL = "static/"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _dsn.get("dbname", ""),
        "USER": _dsn.get("user", ""),
        "PASSWORD": _dsn.get("password", ""),
        "HOST": _dsn.get("host", ""),
        "PORT": _dsn.get("port", ""),
    }
}

TASKS = {
    "default": {
        "BACKEND": "pyqueue.contrib.django.DelayedQueueBackend",
        "QUEUES": ["default", "emails", "slow"],
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"pyqueue": {"handlers": ["console"], "level": "INFO"}},
}
