"""The sans-I/O core, shared by the sync and the asyncio sides; nothing here touches a socket, a
thread or a signal.

- :mod:`~pyqueue.core.checks`: the argument checks made before any I/O.
- :mod:`~pyqueue.core.statements`: every operation as data (:class:`~pyqueue.core.statements.Statement`:
  SQL text qualified per install schema, checked parameters, a decoder of the rows).
- :mod:`~pyqueue.core.steps`: the one vocabulary of steps (what a routine or the worker core asks
  its driver to do) and the :class:`~pyqueue.core.steps.Stepper` that drives them.
- :mod:`~pyqueue.core.routines`: the client operations of several steps (waiting polls, the LISTEN
  probe, ``transaction()``).
- :mod:`~pyqueue.core.delivery`: the worker's decisions and its book of deliveries.
- :mod:`~pyqueue.core.middleware`: the extension point around handler calls and offers.
"""
