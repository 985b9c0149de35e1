#!/usr/bin/env bash
# Install the OS packages this project needs (Debian/Ubuntu): the PostgreSQL server and client,
# pg_cron for the installed major version, and PgBouncer (tests). Does nothing when everything is present.
set -euo pipefail

need=()
major=""
for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5 -n -r); do
    [ -x "$d/pg_ctl" ] && { major=$(basename "$(dirname "$d")"); break; }
done
if [ -z "$major" ]; then
    major=15
    need+=("postgresql-$major" "postgresql-client-$major")
fi
command -v psql >/dev/null || need+=("postgresql-client-$major")
[ -f "/usr/lib/postgresql/$major/lib/pg_cron.so" ] || need+=("postgresql-$major-cron")
command -v runuser >/dev/null || need+=(util-linux)
# PgBouncer: the tests run the worker behind it (transaction pooling: no LISTEN/NOTIFY).
[ -x /usr/sbin/pgbouncer ] || command -v pgbouncer >/dev/null || need+=(pgbouncer)

if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "install-os-deps: missing ${need[*]}; run as root: apt-get install -y ${need[*]}" >&2
    exit 1
fi
echo "install-os-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q "${need[@]}" >/dev/null 2>&1; then
    apt-get update -q >/dev/null
    apt-get install -y -q "${need[@]}" >/dev/null
fi
