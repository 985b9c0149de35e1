# make demo   — everything from nothing: venv, private PostgreSQL with pg_cron, migrations, the demo
# make test   — the whole test suite against a real server (DQ_TEST_DSN, testcontainers, or local)
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
# DQ_PGPORT / DQ_PGDB move everything: the private server (scripts/localpg.sh reads them) and the DSN
# of every target below (DQ_PGPORT=55470 make demo uses only the server on port 55470).
DQ_PGPORT ?= 55432
DQ_PGDB ?= dq
export DQ_PGPORT DQ_PGDB
DSN ?= postgresql://postgres:postgres@127.0.0.1:$(DQ_PGPORT)/$(DQ_PGDB)
SCHEMA ?= public
DOCKER_ENGINE := $(shell docker info >/dev/null 2>&1 && echo yes)

.PHONY: venv up down psql migrate demo test bench bench-quick bench-latency bench-peers bench-controls bench-spark bench-snapshot bench-targets chaos chaos-graph soak console-screenshots lint clean release-snapshot

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

up:
ifeq ($(DOCKER_ENGINE),yes)
	docker compose up -d --wait
else
	scripts/install-os-deps.sh
	scripts/localpg.sh up >/dev/null
endif
	@echo "PostgreSQL with pg_cron: $(DSN)"

down:
ifeq ($(DOCKER_ENGINE),yes)
	docker compose down
else
	scripts/localpg.sh down
endif

psql: up
	psql "$(DSN)"

migrate: venv up
	$(VENV)/bin/pyqueue migrate --dsn "$(DSN)" --schema "$(SCHEMA)"

demo: venv up
	$(PY) examples/demo.py --dsn "$(DSN)"

test: venv
	scripts/install-os-deps.sh
	$(PY) -m pytest -q

bench: venv up
	$(PY) -m bench.core --dsn "$(DSN)"
	$(PY) -m bench.latency --dsn "$(DSN)"

# Real `pyqueue worker` processes: lateness, idle query rate, throughput beside the plain-SQL baseline
bench-latency: venv up
	$(PY) -m bench.latency --dsn "$(DSN)"

# Beside procrastinate, pgqueuer and the plain-SQL baseline; regenerates docs/performance.md and .png
# make bench-peers [PEERS_ARGS="--quick"]
bench-peers: venv up
	$(VENV)/bin/pip install -q -e '.[bench]'
	$(PY) -m bench.peers --dsn "$(DSN)" $(PEERS_ARGS)

# Delivery controls: no-controls throughput beside the release before them, polls and drains of
# 1,000,000-message backlogs with priorities and FIFO groups, rate-limit precision (about 14 min):
# make bench-controls [CONTROLS_ARGS="--quick"]   (--quick: backlogs of 100,000, about 6 min)
bench-controls: venv up
	$(PY) -m bench.controls --dsn "$(DSN)" $(CONTROLS_ARGS)

# The speed figures users compare first (batched offers and polls, one worker, 16 workers), each against
# plain SQL in the same run, median of 3 with the spread and PASS/MISS verdicts (about 4 min):
# make bench-targets [TARGETS_ARGS="--quick"]
bench-targets: venv up
	$(PY) -m bench.targets --dsn "$(DSN)" $(TARGETS_ARGS)

bench-quick: venv up
	$(PY) -m bench.core --dsn "$(DSN)" --quick

bench-spark: venv up
	$(PY) -m bench.spark --dsn "$(DSN)"

# Recovery after a held snapshot, on a private server of its own (started and removed by the run): 200 offers/s
# to 16 pyqueue worker processes, 60 s clean, 120 s while a REPEATABLE READ transaction stays idle, 120 s after it
# ends; claim latency and dq_messages' sizes per 10 s (about 6 min; --quick: about 2.5):
# make bench-snapshot [SNAPSHOT_ARGS="--quick --naptime 10"]
bench-snapshot: venv
	scripts/install-os-deps.sh
	$(PY) -m bench.snapshot $(SNAPSHOT_ARGS)

# Fault injection with exact accounting, on a private server of its own (started and removed by the run), in
# the three modes side by side (exactly-once, at-least-once, graph):
# make chaos [CHAOS_ARGS="--duration 120 --mode exactly-once --seed 1 --out /tmp/chaos.json"]
# Every benchmark writes its summary to bench/results/ and its full report to bench/results/raw/ (bench/README.md).
chaos: venv
	scripts/install-os-deps.sh
	$(PY) -m bench.chaos --mode all $(CHAOS_ARGS)

# The same faults under a graph workload: small DAGs of messages offered after others (an ETL shape and
# chains) across two queues; no child may run before its parents are acknowledged, none may stay blocked:
# make chaos-graph [CHAOS_ARGS="--duration 120 --graph-rate 400 --seed 1"]   (make chaos runs it with the other two)
chaos-graph: venv
	scripts/install-os-deps.sh
	$(PY) -m bench.chaos --mode graph $(CHAOS_ARGS)

# Soak: steady load (300 offers/s per queue, both modes) with a fault every 30 s for 10 minutes on a private
# server of its own; then exact accounting, table and index sizes over time (autovacuum keeps up) and the
# workers' memory (RSS); writes the summaries bench/results/soak.json and soak.md (about 11 min):
# make soak [SOAK_ARGS="--duration 600 --rate 300 --seed 1"]
soak: venv
	scripts/install-os-deps.sh
	$(PY) -m bench.soak $(SOAK_ARGS)

# Screenshots of the web console into docs/console/ (overview, queue, message, dead-letters, schedules, health,
# audit .png): writes a demo data set into DSN (it empties and refills its own queues emails, webhooks, invoices,
# reports, dead-letters and schedules nightly-report, hourly-digest), runs `pyqueue console --allow-actions` on
# it and drives Debian's chromium through the pages (tests/support/consolebrowser.py, consoledemo.py).
console-screenshots: migrate
	scripts/install-os-deps.sh
	$(PY) tests/support/consolebrowser.py screenshots --dsn "$(DSN)" --out docs/console

lint: venv
	$(VENV)/bin/ruff check pyqueue tests bench
	$(VENV)/bin/mypy

# After tagging release vX.Y.Z: keep its migrations/ and sql/ for the upgrade test of the next release.
release-snapshot:
	@test -n "$(VERSION)" || { echo "usage: make release-snapshot VERSION=X.Y.Z (tag vX.Y.Z must exist)"; exit 2; }
	rm -f tests/upgrade/pgdelayq-*-db.tar.gz
	git archive --format=tar.gz -o tests/upgrade/pgdelayq-$(VERSION)-db.tar.gz v$(VERSION) migrations sql

clean:
	-scripts/localpg.sh destroy
	-DQ_PGDATA=$(CURDIR)/.pgdata-test DQ_PGPORT=$${DQ_TEST_PGPORT:-55433} scripts/localpg.sh destroy
	rm -rf $(VENV)
