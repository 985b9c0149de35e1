"""What several benchmarks share; each benchmark program (``python -m bench.<name>``) imports these
modules, never another benchmark's internals.

* :mod:`bench.lib.sides`: the ``dq_*`` side and the plain-SQL baseline side (their statements), the
  units of work clients repeat with them, ``connect`` and ``value``.
* :mod:`bench.lib.database`: the benchmark database created afresh, each run's table prepared from
  the same state, what was measured (server settings, functions' digest, git commit), the server's
  statistics (function calls, transactions, autovacuum runs, rows left).
* :mod:`bench.lib.cpu`: CPU accounting of a measurement (the server's backends, the benchmark's
  processes, everything else on the host).
* :mod:`bench.lib.clients`: client processes in lockstep (barrier, warm-up, a fixed measured time).
* :mod:`bench.lib.workers`: ``pyqueue worker`` processes, and a backlog drained by them or by
  baseline clients.
* :mod:`bench.lib.server`: a PostgreSQL server of a run's own, which the run may restart (bench.chaos,
  bench.soak).
* :mod:`bench.lib.report`: console, PASS/MISS, percentiles, machine information, rich tables, the
  shared command-line options, and the results (full report and summary).
"""
