"""What each process of a session used of the host during a load, from Linux's scheduler
statistics: ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds on the CPU, nanoseconds runnable
but waiting for a CPU), summed over the process's threads, and ``/proc/<pid>/comm``.

A server on few cores shares them between the API server, the engine core (which busy-waits for
the worker's output: vLLM's ``MessageQueue.acquire_read`` spins with ``sched_yield`` for a second
after each read, ``vllm/distributed/device_communicators/shm_broadcast.py``) and the load
generator; the run-queue wait says who was kept from a core, and for how long. Linux only; where
``/proc`` has no schedstat the snapshot is empty.
"""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def process_tree(root: int) -> list[int]:
    """``root`` and every live descendant of it (by each process's parent id in ``/proc/<pid>/stat``)."""
    parent: dict[int, int] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, pp in parent.items() if pp in frontier and pid not in out]
        out += frontier
    return out


def snapshot(pids: list[int]) -> dict[str, dict]:
    """``{pid: {"name", "cpu_s", "wait_s"}}`` for the processes still alive (seconds since each
    thread started, summed over the live threads)."""
    out: dict[str, dict] = {}
    for pid in pids:
        base = PROC / str(pid)
        try:
            name = (base / "comm").read_text().strip()
            cpu = wait = 0
            for task in (base / "task").iterdir():
                run_ns, wait_ns, _ = (task / "schedstat").read_text().split()
                cpu, wait = cpu + int(run_ns), wait + int(wait_ns)
        except (OSError, ValueError):
            continue
        out[str(pid)] = {"name": name, "cpu_s": cpu / 1e9, "wait_s": wait / 1e9}
    return out


def usage(before: dict[str, dict], after: dict[str, dict], wall_s: float) -> list[dict]:
    """Per process alive at both snapshots: its name, the share of one core it ran
    (``cpu_cores``) and the share it spent runnable but waiting (``wait_cores``) over ``wall_s``."""
    rows = []
    for pid, b in after.items():
        a = before.get(pid)
        if a is None or wall_s <= 0:
            continue
        rows.append({"pid": int(pid), "name": b["name"], "cpu_cores": (b["cpu_s"] - a["cpu_s"]) / wall_s,
                     "wait_cores": (b["wait_s"] - a["wait_s"]) / wall_s})
    return rows
