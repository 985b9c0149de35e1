#!/usr/bin/env bash
# A private PostgreSQL server with pg_cron, from the local PostgreSQL binaries.
#
#   scripts/localpg.sh up       initdb if needed, start, create the database, print the DSN
#   scripts/localpg.sh down     stop the server (data stays)
#   scripts/localpg.sh destroy  stop and delete the data directory
#   scripts/localpg.sh dsn      print the DSN
#   scripts/localpg.sh status   exit 0 when the server answers
#
# Settings (environment): DQ_PGDATA (default <project>/.pgdata), DQ_PGPORT (default 55432),
# DQ_PGDB (default dq). PostgreSQL refuses to run as root: when invoked as root the server runs
# as the `postgres` user; if that user cannot reach the project folder, the data directory
# falls back to /tmp/dq-pgdata-<hash of the intended path>.
set -euo pipefail

PROJECT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PORT=${DQ_PGPORT:-55432}
DB=${DQ_PGDB:-dq}
DATA=${DQ_PGDATA:-$PROJECT/.pgdata}

pg_bindir() {
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5 -n -r); do
        [ -x "$d/pg_ctl" ] && { echo "$d"; return; }
    done
    command -v pg_ctl >/dev/null && { dirname "$(command -v pg_ctl)"; return; }
    echo "localpg: no PostgreSQL server binaries found; run scripts/install-os-deps.sh" >&2
    exit 1
}
BIN=$(pg_bindir)

as_pg() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

if [ "$(id -u)" = 0 ] && ! runuser -u postgres -- test -x "$(dirname "$DATA")"; then
    DATA=/tmp/dq-pgdata-$(printf '%s' "$DATA" | md5sum | cut -c1-12)
fi

psql_admin() { as_pg "$BIN/psql" -X -q -h 127.0.0.1 -p "$PORT" -U postgres "$@"; }

dsn() { echo "postgresql://postgres@127.0.0.1:$PORT/$DB"; }

status() { as_pg "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT"; }

up() {
    if [ ! -f "$BIN/../lib/pg_cron.so" ] && [ ! -f "$(dirname "$BIN")/lib/pg_cron.so" ]; then
        "$PROJECT/scripts/install-os-deps.sh"
    fi
    if [ ! -s "$DATA/PG_VERSION" ]; then
        mkdir -p "$DATA"
        [ "$(id -u)" = 0 ] && chown postgres:postgres "$DATA"
        chmod 700 "$DATA"
        as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
        cat >>"$DATA/postgresql.conf" <<CONF
# --- dq private server (scripts/localpg.sh) ---
port = $PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
max_connections = 300
shared_buffers = 512MB
shared_preload_libraries = 'pg_cron'
cron.database_name = '$DB'
log_min_messages = warning
CONF
    fi
    # Members of test_password_auth log in with their password: the tests of a wrong password need
    # a server that asks for one. Every other role stays trusted. The rule goes above initdb's trust
    # lines (the first matching line wins), also into a data directory made before it existed.
    local password_rule="host all +test_password_auth 127.0.0.1/32 scram-sha-256" hba_changed=no
    if ! as_pg grep -qxF "$password_rule" "$DATA/pg_hba.conf"; then
        as_pg sed -i "1i $password_rule" "$DATA/pg_hba.conf"
        hba_changed=yes
    fi
    if status; then
        # Something answers on the port: it must be this data directory's server, not another one.
        if ! as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
            echo "localpg: port $PORT is used by another server (not $DATA); set DQ_PGPORT" >&2
            exit 1
        fi
        if [ "$hba_changed" = yes ]; then
            as_pg "$BIN/pg_ctl" -D "$DATA" reload >/dev/null
        fi
    else
        # -p: the port of this run wins over the one written at initdb (DQ_PGPORT may change).
        as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -o "-p $PORT" -w -t 60 start >/dev/null
    fi
    if [ "$(psql_admin -d postgres -Atc "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != 1 ]; then
        psql_admin -d postgres -c "CREATE DATABASE \"$DB\""
    fi
    psql_admin -d "$DB" -c "CREATE EXTENSION IF NOT EXISTS pg_cron" 2>/dev/null || \
        echo "localpg: pg_cron could not be created in $DB" >&2
    dsn
}

down() {
    if [ -s "$DATA/PG_VERSION" ] && status; then
        as_pg "$BIN/pg_ctl" -D "$DATA" -w -m fast stop >/dev/null
    fi
}

case "${1:-up}" in
    up) up ;;
    down) down ;;
    destroy) down; rm -rf "$DATA" ;;
    dsn) dsn ;;
    status) status ;;
    datadir) echo "$DATA" ;;
    *) echo "usage: $0 up|down|destroy|dsn|status|datadir" >&2; exit 2 ;;
esac
