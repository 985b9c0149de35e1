"""The sync API (public as :mod:`pyqueue` and :mod:`pyqueue.cron`): :mod:`~pyqueue.sync.client`
(:class:`~pyqueue.DelayedQueue`), :mod:`~pyqueue.sync.worker` (:class:`~pyqueue.Worker`, threads)
and :mod:`~pyqueue.sync.cron` (schedules and the ticker thread); the asyncio twins are in
:mod:`pyqueue.aio`."""
