"""The I/O: :mod:`~pyqueue.drivers.sync` performs the core's steps on psycopg's blocking
connections, :mod:`~pyqueue.drivers.aio` on its asyncio ones. A driver decides nothing; the
clients (:mod:`pyqueue.sync`, :mod:`pyqueue.aio`) each *have* one."""
