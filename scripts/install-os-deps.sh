#!/usr/bin/env bash
# Install the OS packages this project needs (Debian/Ubuntu): the PostgreSQL server and client,
# pg_cron for the installed major version, PgBouncer, Prometheus and Chromium (tests). Does nothing when
# everything is present.
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
# Prometheus and promtool: the tests start their own Prometheus on a free port and check the alert rules.
prometheus=""
{ command -v prometheus >/dev/null && command -v promtool >/dev/null; } || prometheus=prometheus
# Chromium and its WebDriver: the web console's tests and `make console-screenshots` drive Debian's chromium
# (Playwright's own browser download is not used). fonts-liberation: a sans-serif font with the usual metrics,
# so pages and screenshots have readable text (Debian makes it only a recommendation of chromium-common).
browser=()
command -v chromium >/dev/null || browser+=(chromium)
command -v chromedriver >/dev/null || browser+=(chromium-driver)
[ -d /usr/share/fonts/truetype/liberation ] || browser+=(fonts-liberation)
all=("${need[@]}" ${prometheus:+"$prometheus"} "${browser[@]}")
missing="${all[*]}"

if [ -z "$missing" ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "install-os-deps: missing $missing; run as root: apt-get install -y $missing" >&2
    exit 1
fi
echo "install-os-deps: installing $missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt_install() {
    if ! apt-get install -y -q "$@" >/dev/null 2>&1; then
        apt-get update -q >/dev/null
        apt-get install -y -q "$@" >/dev/null
    fi
}
if [ ${#need[@]} -gt 0 ]; then
    apt_install "${need[@]}"
fi
if [ ${#browser[@]} -gt 0 ]; then
    # No recommends: they add udev, upower, a notification daemon and printer tools; headless Chromium with
    # --no-sandbox --disable-gpu needs none of them (nor chromium-sandbox, which is setuid).
    apt_install --no-install-recommends "${browser[@]}"
fi
if [ -n "$prometheus" ]; then
    # Debian's package enables a service listening on :9090 that the tests neither need nor want: keep it
    # from starting during the install (policy-rc.d, exit 101 = "action forbidden", see
    # /usr/share/doc/init-system-helpers/README.policy-rc.d.gz), then stop and disable it in case it started
    # anyway. No recommends: they add prometheus-node-exporter, another service.
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
        trap 'rm -f "$policy"' EXIT
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
    fi
    apt_install --no-install-recommends prometheus
    if [ -d /run/systemd/system ]; then
        systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    else
        /etc/init.d/prometheus stop >/dev/null 2>&1 || true
        update-rc.d prometheus disable >/dev/null 2>&1 || true
    fi
fi
