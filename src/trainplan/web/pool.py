"""Where the server's CPU work runs, so that the event loop only moves bytes.

A plan (milliseconds) runs in a small thread pool (`cpu_threads`). A search or a comparison
(seconds, and numpy holds the GIL for much of it) runs in one of a few worker processes
(`HeavyPool`): at most `workers` at once, `queue` more waiting, and any beyond that are
answered at once with 503 and Retry-After rather than queued without end. Each job has a
deadline past its own time bound; a worker that overruns it is killed (a process can be
stopped, a thread cannot) and a fresh one takes its place.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from .body import Refusal

RETRY_AFTER_S = 5  # what a shed request is told to wait
# Searches yield the CPU to the server's own process (its plans, its event loop) when both want it.
WORKER_NICENESS = 10
JOBS_PER_WORKER = 100  # a worker process is replaced after this many jobs (its heap does not grow for ever)


def cpu_threads() -> int:
    """Threads for plans: one per core (the work holds the GIL, more would only queue there)."""
    return max(2, os.cpu_count() or 2)


def heavy_workers() -> int:
    """Worker processes for searches: half the cores, so that plans keep the other half."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def _send(out, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(struct.pack("<Q", len(data)) + data)
    out.flush()


def _receive(inp):
    head = inp.read(8)
    if len(head) < 8:
        raise EOFError("the pipe closed")
    (size,) = struct.unpack("<Q", head)
    data = inp.read(size)
    if len(data) < size:
        raise EOFError("the pipe closed")
    return pickle.loads(data)


def _serve() -> None:
    """A worker process (`python -m trainplan.web.pool`): run jobs read from stdin, answer on
    stdout, until stdin closes. Anything else printed goes to stderr."""
    from ..errors import PlanError
    from . import jobs

    os.nice(WORKER_NICENESS)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    while True:
        try:
            name, args = _receive(inp)
        except EOFError:
            return
        try:
            answer = ("ok", jobs.JOBS[name](*args))
        except PlanError as err:
            answer = ("refused", 422, err.field, err.rule)
        except Refusal as err:
            answer = ("refused", err.status, err.field, err.rule)
        except Exception as err:  # a bug: reported to the server as one, the worker carries on
            answer = ("failed", f"{type(err).__name__}: {err}")
        _send(out, answer)


class _Worker:
    """One worker process, started from the same interpreter with the server's import path."""

    def __init__(self):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen([sys.executable, "-m", "trainplan.web.pool"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env)
        self.jobs = 0

    def call(self, name: str, args: tuple, seconds: float):
        self.jobs += 1
        _send(self.process.stdin, (name, args))
        ready, _, _ = select.select([self.process.stdout], [], [], seconds)
        if not ready:
            raise TimeoutError
        return _receive(self.process.stdout)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class HeavyPool:
    """Searches and comparisons: `workers` at a time in worker processes (or, with
    isolate=False, in threads), `queue` more waiting; the rest shed with 503."""

    def __init__(self, workers: int | None = None, queue: int | None = None, isolate: bool = True):
        self.workers = workers or heavy_workers()
        self.queue = 2 * self.workers if queue is None else queue
        self.isolate = isolate
        self.threads = ThreadPoolExecutor(self.workers, thread_name_prefix="trainplan-heavy")
        self.lock = threading.Lock()
        self.idle: list[_Worker] = []
        self.pending = 0
        self.started = 0  # worker processes started so far

    @contextmanager
    def admit(self):
        """A place among the running and waiting jobs, or a 503 when there is none."""
        with self.lock:
            if self.pending >= self.workers + self.queue:
                raise Refusal(503, "server", f"busy: {self.workers} searches running and {self.queue} waiting; "
                              f"try again in {RETRY_AFTER_S} s", {"Retry-After": str(RETRY_AFTER_S)}, where="server")
            self.pending += 1
        try:
            yield
        finally:
            with self.lock:
                self.pending -= 1

    async def run(self, name: str, args: tuple, seconds: float) -> bytes:
        """The job's answer; Refusal (422, or 503 past its deadline) or RuntimeError (a bug)."""
        with self.admit():
            return await asyncio.wrap_future(self.threads.submit(self._run, name, args, seconds))

    def _run(self, name: str, args: tuple, seconds: float) -> bytes:
        if not self.isolate:
            from . import jobs

            return jobs.JOBS[name](*args)
        worker = self._take()
        try:
            out = worker.call(name, args, seconds)
        except TimeoutError:
            worker.stop()
            raise Refusal(503, name, f"ran past its {seconds:g} s deadline and was stopped; fix some layout "
                          "dimensions or compare fewer accelerators", {"Retry-After": str(RETRY_AFTER_S)},
                          where="server") from None
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            worker.stop()
            raise RuntimeError(f"the {name} worker process died ({exc!r})") from None
        self._give(worker)
        if out[0] == "ok":
            return out[1]
        if out[0] == "refused":
            raise Refusal(*out[1:])
        raise RuntimeError(out[1])

    def _take(self) -> _Worker:
        with self.lock:
            if self.idle:
                return self.idle.pop()
            self.started += 1
        return _Worker()

    def _give(self, worker: _Worker) -> None:
        if worker.jobs >= JOBS_PER_WORKER:
            worker.stop()
            return
        with self.lock:
            self.idle.append(worker)

    def close(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        for worker in idle:
            worker.stop()
        self.threads.shutdown(wait=False, cancel_futures=True)


if __name__ == "__main__":
    _serve()
