#!/usr/bin/env bash
# Run the django-tasks project's own tests (and django-tasks-db's backend tests) against
# pyqueue.contrib.django.DelayedQueueBackend. Not run by CI; downloads nothing: give it checkouts.
#
#   scripts/run-django-tasks-suite.sh DJANGO_TASKS_CHECKOUT [DJANGO_TASKS_DB_CHECKOUT]
#
# DJANGO_TASKS_CHECKOUT: a checkout of github.com/RealOrangeOne/django-tasks at the tag of the
# installed django-tasks (0.12.0); DJANGO_TASKS_DB_CHECKOUT: of RealOrangeOne/django-tasks-db at the
# tag of the installed django-tasks-db (0.12.0), where Django's reference DatabaseBackend and its
# tests live since django-tasks 0.12. E.g. `git archive 0.12.0 | tar -x -C /tmp/django-tasks`.
#
# Environment: DQ_TEST_DSN, an admin DSN of a PostgreSQL server (default: the private test server of
# scripts/localpg.sh on DQ_TEST_PGPORT, 55433); PYTHON (default .venv/bin/python).
#
# Only settings are adapted, in a temporary folder outside both checkouts; no test code is changed:
#
# 1. django-tasks' tests/tests, with PostgreSQL, pyqueue.contrib.django installed and
#    TASKS["pyqueue"] = DelayedQueueBackend (TASKS["default"] stays the framework's default, which
#    test_compat asserts). Every test class there pins its own backend (DummyBackend,
#    ImmediateBackend, a custom one) with override_settings, and TaskTestCase's setUp calls
#    DummyBackend.clear(): this run shows that the app and the backend coexist with the framework's
#    tests (its system checks included), not that ours passes them.
# 2. django-tasks-db's DatabaseBackendTestCase (the backend tests whose backend comes from the
#    settings: enqueue, get_result, refresh, missing ids, checks, transactions, run_after, ids) with
#    TASKS["default"] = DelayedQueueBackend and QUEUES as theirs. The other classes there pin
#    django_tasks_db.DatabaseBackend and run its db_worker: they test that backend, not ours.
#
# Test databases are copies of a template where pyqueue is installed (DATABASES TEST TEMPLATE).
set -euo pipefail

PROJECT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TASKS_DIR=${1:?usage: $0 DJANGO_TASKS_CHECKOUT [DJANGO_TASKS_DB_CHECKOUT]}
TASKS_DB_DIR=${2:-}
TASKS_DIR=$(cd "$TASKS_DIR" && pwd)
[ -n "$TASKS_DB_DIR" ] && TASKS_DB_DIR=$(cd "$TASKS_DB_DIR" && pwd)
PYTHON=${PYTHON:-$PROJECT/.venv/bin/python}
PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")

if [ -z "${DQ_TEST_DSN:-}" ]; then
    DQ_TEST_DSN=$(cd "$PROJECT" && "$PYTHON" -c 'from pyqueue import testing; print(testing.server_dsn())')
fi
TEMPLATE=dq_django_tasks_suite_template
WORK=$(mktemp -d /tmp/django-tasks-suite.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# The template: pyqueue installed (the test runner copies it into each test database).
"$PYTHON" - "$DQ_TEST_DSN" "$TEMPLATE" <<'EOF'
import sys
from pyqueue import testing
testing.create_template(sys.argv[1], sys.argv[2])
EOF

# Settings shared by both runs: the server, the template, our app and backend.
cat > "$WORK/pyqueue_suite_common.py" <<EOF
from psycopg.conninfo import conninfo_to_dict

_dsn = conninfo_to_dict("$DQ_TEST_DSN")
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _dsn.get("dbname", "postgres"),
        "USER": _dsn.get("user", ""),
        "PASSWORD": _dsn.get("password", ""),
        "HOST": _dsn.get("host", ""),
        "PORT": _dsn.get("port", ""),
        "TEST": {"NAME": "test_dq_django_tasks_suite", "TEMPLATE": "$TEMPLATE"},
    }
}
OURS = "pyqueue.contrib.django.DelayedQueueBackend"
EOF

# 1. django-tasks: its settings, then ours on top.
cat > "$WORK/pyqueue_suite_django_tasks.py" <<'EOF'
from tests.settings import *  # noqa: F403 - theirs first

from pyqueue_suite_common import DATABASES, OURS  # noqa: F401

INSTALLED_APPS = [*INSTALLED_APPS, "pyqueue.contrib.django"]  # noqa: F405
# Their default backend stays the framework's (test_compat asserts it); ours is loaded and checked.
TASKS = {"default": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend"},
         "pyqueue": {"BACKEND": OURS, "QUEUES": []}}
EOF

# 2. django-tasks-db: its settings without dj_database_url (not needed: the database is ours).
cat > "$WORK/pyqueue_suite_django_tasks_db.py" <<'EOF'
from pyqueue_suite_common import DATABASES, OURS  # noqa: F401

ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["django_tasks_db", "tests", "pyqueue.contrib.django"]
SECRET_KEY = "abcde12345"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
USE_TZ = True
TASKS = {"default": {"BACKEND": OURS, "QUEUES": ["default", "queue-1"]}}
EOF

status=0
echo "== django-tasks $(git -C "$TASKS_DIR" describe --tags 2>/dev/null || basename "$TASKS_DIR"): tests/tests"
(cd "$TASKS_DIR" && PYTHONPATH="$WORK:$TASKS_DIR" DJANGO_SETTINGS_MODULE=pyqueue_suite_django_tasks \
    "$PYTHON" -m django test tests --noinput -v 1) || status=$?
if [ -n "$TASKS_DB_DIR" ]; then
    echo "== django-tasks-db: tests.tests.DatabaseBackendTestCase with DelayedQueueBackend"
    (cd "$TASKS_DB_DIR" && PYTHONPATH="$WORK:$TASKS_DB_DIR" DJANGO_SETTINGS_MODULE=pyqueue_suite_django_tasks_db \
        "$PYTHON" -m django test tests.tests.DatabaseBackendTestCase --noinput -v 2) || status=$?
fi
"$PYTHON" - "$DQ_TEST_DSN" "$TEMPLATE" <<'EOF'
import sys
from pyqueue import testing
testing.drop_database(sys.argv[1], sys.argv[2])
EOF
exit "$status"
