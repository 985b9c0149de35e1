"""CPU accounting. Throughput on a shared host is noisy. Each run therefore also records, over its
measurement window, the CPU time of the database's backends per row (server cost, a figure other
load hardly moves) and the share of the machine's CPU used by processes outside the benchmark.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuSnapshot:
    busy_s: float  # the whole machine, all but idle and iowait
    clients_s: float  # the benchmark's processes (the parent and its children)
    server_s: float  # the processes of the benchmark database (backends, its autovacuum workers)

    @classmethod
    def take(cls, bench_pid: int, db_name: str) -> CpuSnapshot:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        clients = server = 0
        tag = f" {db_name} ".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ") + b" "
            except OSError:
                continue  # exited meanwhile
            used = int(stat[11]) + int(stat[12])  # utime + stime
            if bench_pid in (int(entry.name), int(stat[1])):
                clients += used
            elif tag in cmd:
                server += used
        return cls((sum(ticks) - ticks[3] - ticks[4]) / CLK_TCK, clients / CLK_TCK, server / CLK_TCK)

    def until(self, later: CpuSnapshot, elapsed_s: float) -> dict[str, float]:
        """Server CPU seconds, and the share of all CPUs that other processes used, between the two."""
        server = later.server_s - self.server_s
        other = (later.busy_s - self.busy_s) - server - (later.clients_s - self.clients_s)
        return {"server_cpu_s": server, "other_cpu": max(other, 0.0) / (elapsed_s * (os.cpu_count() or 1))}


@dataclass
class Window:
    """CPU accounting of one measurement (CpuSnapshot): taken before the backlog
    becomes visible, and after the queue was found empty, while every session that worked in
    between is still open (a process that exits meanwhile takes its CPU time along)."""

    db_name: str
    counter_pid: int  # the backend of the driver's counting session: its CPU is not the consumers' work
    snap: CpuSnapshot | None = None
    t0: float = 0.0
    counter0: float = 0.0

    @staticmethod
    def _cpu_s(pid: int) -> float:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")

    def start(self) -> None:
        self.counter0 = self._cpu_s(self.counter_pid)
        self.snap, self.t0 = CpuSnapshot.take(os.getpid(), self.db_name), time.perf_counter()

    def result(self, n: int) -> dict[str, float]:
        assert self.snap is not None
        after = CpuSnapshot.take(os.getpid(), self.db_name)
        cpu = self.snap.until(after, time.perf_counter() - self.t0)
        counter = self._cpu_s(self.counter_pid) - self.counter0
        return {
            "server_us_per_row": (cpu["server_cpu_s"] - counter) * 1e6 / n,
            "consumer_us_per_row": (after.clients_s - self.snap.clients_s) * 1e6 / n,
            "counting_server_cpu_s": counter,
            "other_cpu": cpu["other_cpu"],
        }

