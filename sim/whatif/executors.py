"""Where a sweep's point tasks run: in this process, in a pool of worker processes, or on Dask
(:func:`sim.whatif.sweeps.sweep` gives each the function that runs one task); each yields the
tasks' results as they finish."""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

from sim.errors import UserInputError


def execute_local(run: Callable[[Any], dict], tasks: list, workers: Optional[int]) -> Iterator[tuple[Any, dict]]:
    """``run`` of each task, in this process (one worker) or in a pool of ``workers`` processes
    (fork server where there is one, else spawn; ``run`` must be importable by name): yields
    (task, its result) as each finishes. A Ctrl-C, a failed task or the caller stopping stops the
    workers at once."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(tasks)))
    if workers == 1:
        for t in tasks:
            yield t, run(t)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # forkserver: no fork of a parent that runs threads (rich's progress refresh); spawn elsewhere
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        # preload run's module instead of __main__, so a script without a __main__ guard works
        ctx.set_forkserver_preload([run.__module__])
    else:
        ctx = mp.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
    try:
        with interrupts_held():  # the workers (and the fork server) start with Ctrl-C blocked: this process answers it
            futures = {pool.submit(run, t): t for t in tasks}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()
    except BaseException:  # Ctrl-C, a failed point, the caller gone: stop the workers now (finished points are saved)
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            if proc.is_alive():
                proc.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def interrupts_held() -> Iterator[None]:
    """A Ctrl-C held back while the block runs, raised (KeyboardInterrupt) when it ends: SIGINT
    is blocked in this thread, so the processes the block starts inherit the mask and a Ctrl-C
    sent to the whole process group reaches only the sweep's own process (no traceback from each
    worker or from the fork server's import), and one that came just before is recorded rather
    than raised half way through starting a worker (which then outlived the sweep). Outside the
    main thread or where signal masks do not exist: nothing."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a Ctrl-C held back is delivered now: recorded
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def execute_dask(run: Callable[[Any], dict], tasks: list, workers: Optional[int], scheduler: Optional[str],
                 client=None) -> Iterator[tuple[Any, dict]]:
    """``run`` of each task on Dask (tasks with a ``point_id``): connects now (an unreachable or malformed ``scheduler`` fails
    before any progress is shown) and returns the stream of finished tasks.

    Raises:
        UserInputError: dask.distributed missing, or ``scheduler`` cannot be reached (named ``--scheduler``).
    """
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise UserInputError("--executor dask", "", "needs dask.distributed: pip install 'overlap-sim[dask]'") from None

    own_client = own_cluster = None
    if client is None:
        if scheduler:
            try:
                client = own_client = Client(scheduler, timeout="10s")
            except (OSError, TimeoutError, ValueError) as err:  # ValueError: not an address (no port, ...)
                raise UserInputError("--scheduler", "", f"cannot reach the Dask scheduler {scheduler} ({err}); "
                                                        "expected an address such as tcp://host:8786") from None
        else:
            own_cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
                                       dashboard_address=None)
            client = own_client = Client(own_cluster)

    def stream() -> Iterator[tuple[Any, dict]]:
        try:
            futures = {client.submit(run, t, key=f"overlap-sim-point-{t.point_id}", pure=False): t
                       for t in tasks}
            for fut in as_completed(futures):
                yield futures[fut], fut.result()
        finally:
            if own_client is not None:
                own_client.close()
            if own_cluster is not None:
                own_cluster.close()

    return stream()
