"""User code under a time limit: worker processes that hold named objects (reward functions, stateful reward
classes, environments) and run calls on them, each call bounded by a wall-clock limit.

One :class:`Worker` is one child interpreter started with :mod:`subprocess` (``python -c`` importing this module,
not :mod:`multiprocessing`): the child never re-imports the trainer's ``__main__`` (a user script without a
``__name__`` guard would run again under ``spawn`` / ``forkserver``), never inherits the trainer's threads or CUDA
state (``fork`` after CUDA initialisation is undefined behaviour) and does not import torch unless the user's code
does. Requests and replies travel over two pipes of their own (:class:`multiprocessing.connection.Connection`'s
framing), so what the user's code prints on stdout cannot corrupt them. Requests (made by the trainer only) are
pickled; replies are JSON plain data checked field by field (:mod:`rlhfkit.rewards.wire`): nothing a worker sends
is unpickled in the trainer, and a reply that is not what the wire allows kills the worker (:class:`CallFailed`,
kind ``bad reply``).

- ``setup(key, spec, kwargs)`` loads ``spec`` (a spec string as :func:`~rlhfkit.rewards.loading.load_reward_function`
  reads it, or a picklable callable) in the child and keeps it under ``key``; a class is built there once as
  ``Class(**kwargs)`` (a reward with state, an environment); a function gets ``kwargs`` bound.
- ``call(key, method, args, kwargs, timeout)`` runs ``obj(*args, **kwargs)`` (or ``obj.method(...)``) in the child.
  A call that passes its limit kills the child's whole process group (what the user's code started dies with it)
  and raises :class:`CallTimeout`; an exception inside the call raises :class:`CallFailed` (type, message); a child
  that dies raises :class:`CallFailed` too. A dead or killed child is restarted on the next use and its set-ups
  replayed (an object's state is lost then; environments must treat the episode as failed).

:class:`WorkerPool` spreads independent calls over several workers, each under its own limit, and returns one
:class:`Outcome` per call; the caller goes on whatever happens to one of them. ``workers=0`` runs everything in
the calling process without a limit (for objects that cannot be pickled, and for debugging).

What user code prints is capped at :data:`OUTPUT_LIMIT` bytes per call and stream (a reward printing 150 MB must not
flood the terminal or the logs): in a child, its file descriptors 1 and 2 are pipes read by a thread that passes on
the first bytes of each call and one line saying the rest was cut (C code writing to the descriptors included); in
this process (``workers=0``), Python's ``sys.stdout`` / ``sys.stderr`` are capped around each call.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import os
import pickle
import secrets
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import EnvError, RewardError
from . import wire

BOOT = "from rlhfkit.rewards.workers import _child_main; _child_main({r}, {w})"
SETUP_TIMEOUT_S = 300.0  # loading a model in a stateful reward's constructor may take minutes
OUTPUT_LIMIT = 64 << 10  # bytes of stdout (and of stderr) user code may print per call; the rest is cut
#: seconds: a reply whose first bytes arrived is complete within the call's time left, and at least this long
FRAME_S = 2.0


class CallTimeout(Exception):
    """A call ran past its wall-clock limit; the worker was killed (and restarts on its next use)."""


class CallFailed(Exception):
    """The call raised (``kind`` is the exception's type name), the worker died under it (``kind`` 'died') or sent
    a reply the wire does not allow and was killed for it (``kind`` 'bad reply'): :attr:`worker_lost` for both."""

    def __init__(self, kind: str, message: str, trace: str = ""):
        self.kind, self.message, self.trace = kind, message, trace
        super().__init__(f"{kind}: {message}" if message else kind)

    @property
    def worker_lost(self) -> bool:
        """The worker is gone (and restarts on its next use, its objects' state lost)."""
        return self.kind in ("died", "bad reply")


@dataclass
class Outcome:
    """What one call of :meth:`WorkerPool.map` ended with: ``value`` (on success), ``error`` (a
    :class:`CallTimeout`, a :class:`CallFailed`, or a :class:`~rlhfkit.errors.UserError` the code raised) and the
    seconds it took."""

    value: Any = None
    error: Exception | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


class Job(NamedTuple):
    """One call for :meth:`WorkerPool.run`: ``obj(*args, **kwargs)`` (or ``obj.<method>``) of the object ``key``,
    on worker ``on`` (modulo the pool's size) or on any free one (None)."""

    key: str
    method: str | None = None
    args: tuple = ()
    kwargs: dict = {}
    on: int | None = None


@dataclass
class _Setup:
    key: str
    spec: Any  # spec string, or pickled bytes of a callable
    kwargs: dict = field(default_factory=dict)
    label: str = ""

    @classmethod
    def of(cls, key: str, spec: Any, kwargs: dict | None, label: str | None) -> _Setup:
        return cls(key, _portable(spec, label or str(spec)), dict(kwargs or {}), label or str(spec))


def _portable(spec: Any, label: str) -> Any:
    """What a child is sent to load ``spec``: the spec string, or the pickled callable (refused with one line when
    it cannot be pickled: a lambda, a closure, a bound method of an object built in the trainer)."""
    if isinstance(spec, str):
        return spec
    try:
        return pickle.dumps(spec)
    except Exception as exc:
        raise RewardError(f"function {label} cannot be sent to a worker process ({type(exc).__name__}: {exc})",
                          where="reward.functions", fix="give it as package.module:function or file.py:function, "
                          "or set reward.workers=0 to call it in the trainer's process (no time limit)") from None


class Worker:
    """One child process holding named objects; see the module docstring."""

    def __init__(self, name: str = "worker"):
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.send_conn: Connection | None = None
        self.recv_conn: Connection | None = None
        self.setups: dict[str, _Setup] = {}
        self.restarts = 0
        self._starting = False  # launched, its start not yet answered
        self._expect: collections.deque[str] = collections.deque()  # the ids of the requests awaiting a reply

    # ── life cycle ───────────────────────────────────────────────────────────────────────────────────────────
    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the child (if not running) and replay every set-up; a set-up that fails raises its error."""
        if self.launch():
            todo = list(self.setups.values())
            self.send_setups(todo)
            self.settle(todo)

    def launch(self) -> bool:
        """Spawn the child and send it this process's path, without waiting for it (False: it was running)."""
        if self.alive:
            return False
        self.kill()
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        src = str(Path(__file__).resolve().parents[2])  # where rlhfkit is, installed or not
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])]))
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", BOOT.format(r=req_r, w=rep_w)],
                                         pass_fds=(req_r, rep_w), start_new_session=True, env=env,
                                         stdin=subprocess.DEVNULL)
        finally:
            os.close(req_r)
            os.close(rep_w)
        self.send_conn, self.recv_conn = Connection(req_w, readable=False), Connection(rep_r, writable=False)
        self._send(("path", list(sys.path), os.getcwd()), answered=True)
        self._starting = True
        return True

    def send_setups(self, setups: Sequence[_Setup]) -> None:
        """Send each set-up to the child, without waiting for it (:meth:`settle` collects the replies)."""
        for s in setups:
            self._send(("setup", s.key, s.spec, s.kwargs, s.label), answered=True)

    def begin_setup(self, s: _Setup) -> list[_Setup]:
        """Keep ``s`` and send the child what it must load, without waiting: ``s``, or every set-up when the child is
        new (launched now). :meth:`settle` on the returned list collects the replies."""
        self.setups[s.key] = s
        todo = list(self.setups.values()) if self.launch() else [s]
        self.send_setups(todo)
        return todo

    def settle(self, setups: Sequence[_Setup]) -> None:
        """The replies of a launch (when one is pending) and of the sent ``setups``, in order; a set-up that fails
        raises its error."""
        if self._starting:
            self._reply(SETUP_TIMEOUT_S, "start")
            self._starting = False
        for s in setups:
            self._reply(SETUP_TIMEOUT_S, f"setting up {s.label}")

    def kill(self) -> None:
        """Kill the child and everything it started (its process group); idempotent."""
        if self.proc is not None:
            if self.proc.poll() is None:
                with _suppress():
                    os.killpg(self.proc.pid, signal.SIGKILL)
            with _suppress():
                self.proc.wait(timeout=10)
            # a grandchild that left the group (setsid) keeps its own life; the pipes below close regardless
        for conn in (self.send_conn, self.recv_conn):
            if conn is not None:
                with _suppress():
                    conn.close()
        self.proc = self.send_conn = self.recv_conn = None
        self._starting = False
        self._expect.clear()

    def close(self) -> None:
        self.ask_exit()
        self.reap()

    def ask_exit(self) -> None:
        """Tell the child to exit, without waiting (:meth:`reap` waits)."""
        if self.alive:
            with _suppress():
                self._send(("exit",))

    def reap(self) -> None:
        """Wait up to 2 s for a child told to exit (an interpreter with torch takes about 0.7 s), then kill it."""
        if self.alive:
            with _suppress():
                self.proc.wait(timeout=2)
        self.kill()

    # ── set-ups and calls ────────────────────────────────────────────────────────────────────────────────────
    def setup(self, key: str, spec: Any, kwargs: dict | None = None, label: str | None = None) -> None:
        """Load ``spec`` under ``key`` in the child (now if it runs, and after every restart)."""
        self.settle(self.begin_setup(_Setup.of(key, spec, kwargs, label)))

    def drop(self, key: str) -> None:
        self.setups.pop(key, None)
        if self.alive:
            self._send(("drop", key))

    def call(self, key: str, method: str | None, args: Sequence = (), kwargs: dict | None = None,
             timeout: float | None = None) -> Any:
        """``obj(*args, **kwargs)`` (or ``obj.<method>(...)``) in the child, within ``timeout`` seconds."""
        self.submit(key, method, args, kwargs)
        return self.result(timeout)

    def submit(self, key: str, method: str | None, args: Sequence = (), kwargs: dict | None = None) -> None:
        self.start()
        self._send(("call", key, method, tuple(args), dict(kwargs or {})), answered=True)

    def result(self, timeout: float | None) -> Any:
        """The reply to the submitted call (see :meth:`call`)."""
        return self._reply(timeout, "call")

    # ── internals ────────────────────────────────────────────────────────────────────────────────────────────
    def _send(self, message: tuple, answered: bool = False) -> None:
        """Send ``(kind, *fields)`` as ``(kind, request id, *fields)``; ``answered``: a reply carrying the id is
        awaited (:meth:`_reply`), so that a reply nobody asked for is seen for what it is."""
        rid = secrets.token_hex(8) if answered else None
        try:
            self.send_conn.send((message[0], rid, *message[1:]))
        except (OSError, EOFError) as exc:  # the child died between calls
            self.kill()
            raise CallFailed("died", f"worker {self.name} exited ({exc})") from None
        if rid is not None:
            self._expect.append(rid)

    def _reply(self, timeout: float | None, what: str) -> Any:
        """The reply to the oldest request awaiting one, within ``timeout`` seconds (a reply that began arriving: at
        least :data:`FRAME_S` more to complete). A reply that is not the wire's, does not answer that request (a
        forged one, written into the pipe by something that reached it) or stops halfway kills the worker:
        :class:`CallFailed` ``bad reply``; the caller loses that call only."""
        conn, rid = self.recv_conn, self._expect.popleft() if self._expect else None
        t0 = time.perf_counter()
        ready = conn.poll(timeout) if timeout is not None else conn.poll(None)
        if not ready:
            self.kill()
            self.restarts += 1
            raise CallTimeout(f"{what} took more than {timeout:g} s")
        left = None if timeout is None else max(FRAME_S, timeout - (time.perf_counter() - t0))
        problem = ""
        try:
            data = wire.read_frame(conn.fileno(), None if left is None else time.perf_counter() + left, FRAME_S)
            status, payload = wire.read_reply(data, rid)
        except EOFError:
            code = self.proc.wait() if self.proc is not None else None
            self.kill()
            self.restarts += 1
            raise CallFailed("died", f"worker exited with code {code} during {what}"
                             + (" (killed by a signal: often the memory limit)" if code and code < 0 else "")) from None
        except (OSError, wire.ProtocolError) as exc:  # not the wire, not this request's, or a frame that stalled
            problem = str(exc)
        if problem:
            self.kill()
            self.restarts += 1
            raise CallFailed("bad reply", f"worker {self.name} sent a reply that is not plain data answering the "
                                          f"request during {what} ({problem}); it was killed and restarts on its "
                                          "next use")
        if status == "ok":
            return payload
        if status == "user_error":
            raise payload
        raise CallFailed(*payload)


class WorkerPool:
    """``n`` workers sharing the same set-ups; :meth:`map` runs independent calls on them concurrently, each
    under ``timeout_s``; :meth:`setup` and :meth:`close` act on every child side by side. ``n = 0``: calls run in
    this process, no limit (see the module docstring), unless ``limit_local``: then each call is bounded by
    ``timeout_s`` with a wall-clock timer signal (:func:`_alarm`) — for callables no worker can import."""

    def __init__(self, n: int, timeout_s: float | None, *, limit_local: bool = False):
        self.n, self.timeout_s, self.limit_local = n, timeout_s, limit_local
        self.workers = [Worker(f"{i}") for i in range(n)]
        self.local: dict[str, Callable] = {}

    def setup(self, key: str, spec: Any, kwargs: dict | None = None, label: str | None = None) -> None:
        """Load ``spec`` under ``key`` on every worker (in this process when ``n = 0``)."""
        if self.n == 0:
            from .loading import instantiate, load_reward_function

            obj = load_reward_function(spec) if isinstance(spec, str) else spec
            self.local[key] = _bind(instantiate(obj, dict(kwargs or {}), label or str(spec)), kwargs)
            return
        s = _Setup.of(key, spec, kwargs, label)
        try:
            # 1. every worker gets what it has to load (a new child: all its set-ups) before any reply is awaited,
            #    so the children start and import side by side: the pool is ready in one child's time, not n (each
            #    child imports the user's code, often torch: ~2 s)
            todo = {w: w.begin_setup(s) for w in self.workers}
            # 2. the replies, worker by worker; a set-up that fails raises its error
            for w, setups in todo.items():
                w.settle(setups)
        except BaseException:
            for w in self.workers:  # replies may be left in the pipes: every child restarts cleanly on its next use
                w.kill()
            raise

    def revive(self) -> None:
        """Start every dead worker (killed for a timeout, a crash) side by side, its set-ups replayed, so that the
        next calls' time limit counts no restart; one that cannot start is left to fail on its next call."""
        todo = {}
        for w in self.workers:
            try:
                if w.launch():
                    todo[w] = list(w.setups.values())
                    w.send_setups(todo[w])
            except (CallFailed, CallTimeout, RewardError):
                w.kill()
        for w, setups in todo.items():
            try:
                w.settle(setups)
            except (CallFailed, CallTimeout, RewardError):
                w.kill()

    def map(self, key: str, calls: Sequence[tuple[tuple, dict]], method: str | None = None,
            deadline: float | None = None) -> list[Outcome]:
        """Run each ``(args, kwargs)`` of ``calls`` on the object ``key``; one :class:`Outcome` per call, in order.
        Calls go to free workers as they free up; each is bounded by ``timeout_s`` from its own start, and all of
        them by ``deadline`` (:meth:`run`)."""
        return self.run([Job(key, method, a, k) for a, k in calls], deadline)

    def run(self, jobs: Sequence[Job], deadline: float | None = None) -> list[Outcome]:
        """Run each :class:`Job` (a job with ``on`` set only on that worker: an object with state lives on one);
        one :class:`Outcome` per job, in order, each call bounded by ``timeout_s`` from its own start and by
        ``deadline`` (a ``time.perf_counter()`` value: the whole of a caller's work, its retries included, ends
        there; a job not started by then is a :class:`CallTimeout` without running). A worker killed for a timeout
        loses every object's state (its set-ups are replayed on its next use): compare ``Worker.restarts``
        before and after to know."""
        if self.n == 0:
            return [self._local(j.key, j.method, j.args, j.kwargs, deadline) for j in jobs]
        out: list[Outcome | None] = [None] * len(jobs)
        pending = list(range(len(jobs)))
        running: dict[int, tuple[int, float, float | None]] = {}  # worker index -> (call index, start, its end)
        while pending or running:
            if deadline is not None and time.perf_counter() >= deadline:  # the caller's time is spent
                for c in pending:
                    out[c] = Outcome(error=CallTimeout("not run: the call's time limit was spent"))
                pending = []
            for w_i, w in enumerate(self.workers):  # 1. hand calls to idle workers
                if w_i in running:
                    continue
                c = next((c for c in pending if jobs[c].on is None or jobs[c].on % self.n == w_i), None)
                if c is None:
                    continue
                pending.remove(c)
                t0, fresh = time.perf_counter(), not w.alive
                try:
                    w.submit(jobs[c].key, jobs[c].method, jobs[c].args, jobs[c].kwargs)
                except (CallFailed, CallTimeout, RewardError) as exc:
                    out[c] = Outcome(error=exc, seconds=time.perf_counter() - t0)
                    continue
                if fresh and deadline is not None:  # a worker's restart is not the calls' time
                    deadline += time.perf_counter() - t0
                t0 = time.perf_counter()  # the limit counts from the call (a restart not included)
                ends = [t for t in (t0 + self.timeout_s if self.timeout_s else None, deadline) if t is not None]
                running[w_i] = (c, t0, min(ends) if ends else None)
            if not running:
                continue
            # 2. wait for a reply, or for the earliest end
            ends = [e for _, _, e in running.values() if e is not None]
            wait([self.workers[w_i].recv_conn for w_i in running],
                 max(0.0, min(ends) - time.perf_counter()) if ends else None)
            # 3. collect what finished and what ran out of time
            for w_i, (c, t0, end) in list(running.items()):
                w, now = self.workers[w_i], time.perf_counter()
                if w.recv_conn.poll(0):
                    try:
                        out[c] = Outcome(value=w.result(0 if end is None else max(0.0, end - now)),
                                         seconds=time.perf_counter() - t0)
                    except (CallFailed, CallTimeout, RewardError) as exc:
                        out[c] = Outcome(error=exc, seconds=time.perf_counter() - t0)
                elif end is not None and now >= end:
                    w.kill()  # the call and whatever it started die; the worker restarts on its next use
                    w.restarts += 1
                    out[c] = Outcome(error=CallTimeout(f"call took more than {now - t0:.3g} s (its limit)"),
                                     seconds=now - t0)
                else:
                    continue
                del running[w_i]
        return out  # type: ignore[return-value]

    def _local(self, key: str, method: str | None, args: tuple, kwargs: dict,
               deadline: float | None = None) -> Outcome:
        """One call in this process: under the timer signal (``limit_local``, bounded by ``deadline`` too); a
        ``sys.exit`` in it is that call's failure, never the run's end."""
        t0 = time.perf_counter()
        obj = self.local[key]
        limit = self.timeout_s if self.limit_local else None
        if limit is not None and deadline is not None:
            limit = deadline - t0
            if limit <= 0:
                return Outcome(error=CallTimeout("not run: the call's time limit was spent"))
        try:
            out, err = _CappedText(sys.stdout), _CappedText(sys.stderr)
            with _alarm(limit), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                value = (getattr(obj, method) if method else obj)(*args, **kwargs)
        except _Expired:
            return Outcome(error=CallTimeout(f"call took more than {limit:.3g} s"), seconds=time.perf_counter() - t0)
        except (RewardError, EnvError) as exc:
            return Outcome(error=exc, seconds=time.perf_counter() - t0)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - sys.exit() in a reward ends the call, not the run
            return Outcome(error=CallFailed(type(exc).__name__, _said(exc), traceback.format_exc()),
                           seconds=time.perf_counter() - t0)
        return Outcome(value=value, seconds=time.perf_counter() - t0)

    def close(self) -> None:
        """Every child told to exit first, then each waited for: the children's interpreters end side by side."""
        for w in self.workers:
            w.ask_exit()
        for w in self.workers:
            w.reap()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # a pool never outlives its owner's process with children left behind
        with _suppress():
            for w in self.workers:
                w.kill()


class _Expired(BaseException):
    """Raised by :class:`_alarm` where the code is when its time is up: a ``BaseException``, so a reward's own
    ``except Exception`` does not swallow it (and the timer fires again every :data:`_alarm.AGAIN` seconds until
    the call returns, so one swallowed does not stop it)."""


class _alarm:
    """A wall-clock limit on the code inside, in this process: SIGALRM (``setitimer``) raises :class:`_Expired` where
    the code is when the time is up, and again every :attr:`AGAIN` seconds until the block ends. Python code stops
    there (an ``async def`` reward's event loop too); code inside one long C call stops when the call returns to the
    interpreter (a worker process, killed whole, has no such limit: the reason workers exist). Only on the main
    thread of a POSIX process (where Python runs signal handlers); elsewhere no limit. ``None``: none."""

    AGAIN = 0.2

    def __init__(self, seconds: float | None):
        self.seconds = seconds if seconds and hasattr(signal, "setitimer") else None
        self.previous, self.active = None, False

    @staticmethod
    def available() -> bool:
        import threading

        return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()

    def _expired(self, signum, frame):
        if self.active:
            raise _Expired()

    def __enter__(self):
        if self.seconds is not None and self.available():
            self.active = True
            self.previous = signal.signal(signal.SIGALRM, self._expired)
            signal.setitimer(signal.ITIMER_REAL, max(self.seconds, 1e-3), self.AGAIN)
        else:
            self.seconds = None
        return self

    def __exit__(self, *exc):
        if self.seconds is not None:
            while self.active:  # a signal at this very line raises once more: the loop goes round
                try:
                    self.active = False
                except _Expired:
                    continue
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous if self.previous is not None else signal.SIG_DFL)
        return False


def _bind(obj: Callable, kwargs: dict | None) -> Callable:
    """A function gets its configured keyword arguments bound; a built object (from a class) took them already."""
    if kwargs and not _is_instance_of_class(obj):
        return functools.partial(obj, **kwargs)
    return obj


def _is_instance_of_class(obj: Any) -> bool:
    import inspect

    return not (inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isbuiltin(obj)
                or isinstance(obj, functools.partial))


def _said(exc: BaseException) -> str:
    """What a failed call's exception says, in one line (``sys.exit(0)`` named as such: its message is a bare code)."""
    return f"sys.exit({exc.code!r}) inside the call" if isinstance(exc, SystemExit) else _first_line(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


class _CappedText(io.TextIOBase):
    """A text stream passing on the first ``limit`` characters written to ``target``, then one line saying the rest
    was cut (:data:`OUTPUT_LIMIT`, in this process)."""

    def __init__(self, target, limit: int = OUTPUT_LIMIT):
        self.target, self.left, self.cut = target, limit, False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self.left > 0:
            self.target.write(text[: self.left])
            self.left -= len(text)
        elif not self.cut:
            self.cut = True
            self.target.write(f"\n[rlhfkit] the rest of this call's output was cut (over {OUTPUT_LIMIT >> 10} KiB)\n")
        return len(text)

    def flush(self) -> None:
        with _suppress():
            self.target.flush()


class _OutputCap:
    """In a worker child: file descriptors 1 and 2 become pipes, each read by a thread that passes on at most
    :data:`OUTPUT_LIMIT` bytes per call to the stream the child inherited, then one line saying the rest was cut;
    :meth:`reset` starts a call's allowance."""

    def __init__(self, name: str):
        self.name, self.lock, self.left, self.cut = name, threading.Lock(), {}, {}
        for fd in (1, 2):
            try:
                original = os.dup(fd)
                read_end, write_end = os.pipe()
                os.dup2(write_end, fd)
                os.close(write_end)
            except OSError:  # no such descriptor: nothing to cap
                continue
            self.left[fd], self.cut[fd] = OUTPUT_LIMIT, False
            threading.Thread(target=self._pump, args=(fd, read_end, original), daemon=True).start()

    def reset(self) -> None:
        with self.lock:
            for fd in self.left:
                self.left[fd], self.cut[fd] = OUTPUT_LIMIT, False

    def _pump(self, fd: int, read_end: int, original: int) -> None:
        while True:
            try:
                data = os.read(read_end, 1 << 16)
            except OSError:
                return
            if not data:
                return
            with self.lock:
                passed, self.left[fd] = data[: max(0, self.left[fd])], self.left[fd] - len(data)
                note = self.left[fd] < 0 and not self.cut[fd]
                self.cut[fd] |= note
            try:
                if passed:
                    os.write(original, passed)
                if note:
                    os.write(original, f"\n[rlhfkit] {self.name}: the rest of this call's output was cut (over "
                                       f"{OUTPUT_LIMIT >> 10} KiB)\n".encode())
            except OSError:
                pass


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], Exception)


# ───────────────────────────────────────────── the child ─────────────────────────────────────────────


def _child_main(read_fd: int, write_fd: int) -> None:
    """The worker's loop: answer requests until ``exit`` or the parent goes away."""
    _die_with_parent()
    cap = _OutputCap("reward worker")
    recv, send = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    objects: dict[str, Callable] = {}
    while True:
        try:
            message = recv.recv()
        except (EOFError, OSError):
            return
        for stream in (sys.stdout, sys.stderr):  # what the last call left in Python's buffers counts for it
            with _suppress():
                stream.flush()
        cap.reset()
        kind, rid = message[0], message[1]
        if kind == "exit":
            return
        try:
            if kind == "path":
                _, _, path, cwd = message
                os.chdir(cwd)
                sys.path[:] = path + [p for p in sys.path if p not in path]
                reply: Any = None
            elif kind == "setup":
                _, _, key, spec, kwargs, label = message
                objects[key] = _child_load(spec, kwargs, label)
                reply = None
            elif kind == "drop":
                objects.pop(message[2], None)
                continue
            else:  # call
                _, _, key, method, args, kwargs = message
                obj = objects[key]
                reply = (getattr(obj, method) if method else obj)(*args, **kwargs)
            data = wire.ok(reply, rid)
        except (RewardError, EnvError) as exc:  # a one-line complaint of the code itself (a built-in rule missing an
            data = wire.user_error(exc, rid)  # option, the OpenEnv adapter's)
        except BaseException as exc:  # noqa: BLE001 - every failure of user code is reported, never fatal here
            try:
                data = wire.error(type(exc).__name__, _said(exc), traceback.format_exc(limit=20), rid)
            except Exception:  # noqa: BLE001 - an exception whose message cannot even be read
                data = wire.error(type(exc).__name__, "(its message could not be read)", "", rid)
        send.send_bytes(data)


def _child_load(spec: Any, kwargs: dict, label: str) -> Callable:
    from .loading import instantiate, load_reward_function

    obj = load_reward_function(spec) if isinstance(spec, str) else pickle.loads(spec)
    return _bind(instantiate(obj, kwargs, label), kwargs)


def _die_with_parent() -> None:
    """Linux: the child gets SIGKILL when the trainer dies (prctl PR_SET_PDEATHSIG); elsewhere it exits when its
    request pipe closes."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except Exception:
        pass
