"""Stop requests: the signals that ask a process to stop at its next safe point (SLURM's warning
before a time limit, the limit's SIGTERM, a preemption, a user's Ctrl-C), recorded rather than
acted on at once, so that a training run finishes its step and checkpoints (:data:`STOP`); a
second Ctrl-C aborts at once. Process-wide; the Ray source and the grading pool read it too.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class StopRequests:
    """The stop signals this process received (SLURM's warning before a time limit, the limit's
    SIGTERM, a preemption, the first Ctrl-C): recorded, never acted on at once, so that a run can
    finish its step and checkpoint; a second SIGINT raises :class:`KeyboardInterrupt` at once (a
    user who presses Ctrl-C twice wants out now). ``gmc train`` installs it before its heavy
    imports, so a signal that arrives while the run starts is not lost either. Whatever replaces
    the recorder later is overruled: ``ray.init`` installs Ray's own SIGTERM handler (it kills
    the Ray processes and exits), so the Ray source calls :meth:`reclaim` once Ray runs, and
    :meth:`install` at the start of the training loop reclaims too. The processes a run starts
    (grading workers, Ray's) start with the signals blocked, and the grading workers ignore them:
    a Ctrl-C in a terminal reaches every process of its group, and they go on until the run has
    checkpointed."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self):
        self.received: list[int] = []
        self.previous: dict = {}  # signal -> the handler before the recorder, for restore()

    def _record(self, signum, frame) -> None:
        if signum == signal.SIGINT and signal.SIGINT in self.received:
            raise KeyboardInterrupt
        self.received.append(signum)

    @property
    def installed(self) -> bool:
        return bool(self.previous)

    def install(self) -> None:
        """Record the stop signals from now on. Idempotent: a second call keeps the handlers the
        first one replaced (what :meth:`restore` puts back) and sets the recorder again, so it
        holds the signals whatever replaced it since (a handler set outside Python included).
        Only the main thread can set handlers; elsewhere this does nothing."""
        if threading.current_thread() is not threading.main_thread():
            return
        for s in self.SIGNALS:
            previous = signal.signal(s, self._record)
            # None: a handler set outside Python, which cannot be put back; the default then
            self.previous.setdefault(s, signal.SIG_DFL if previous is None else previous)

    def reclaim(self) -> None:
        """Put the recorder back where another handler replaced it, if it was installed: what
        code that starts something which takes the signals over (Ray) calls afterwards; a
        process that never installed it is left alone."""
        if self.installed:
            self.install()

    @contextlib.contextmanager
    def blocked(self):
        """The stop signals blocked in the calling thread while the block runs. A process started
        in it inherits them blocked, and so do the processes it starts: Ray's (its head, raylet
        and rollout workers) then go on through a stop that SLURM sends to every process of a
        job, as the grading workers do, and the run finishes its step with them. One that comes
        to this thread meanwhile is delivered when the block ends."""
        before = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)

    def restore(self) -> None:
        """The handlers as they were before the first :meth:`install`, and nothing received (the
        run that acted on it has ended)."""
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        self.previous, self.received = {}, []

    @property
    def name(self) -> str | None:
        return signal.Signals(self.received[0]).name if self.received else None


STOP = StopRequests()
"""The process's record of stop signals."""
