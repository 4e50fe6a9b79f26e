"""Stop requests: SIGTERM, SIGINT and SIGUSR1 ask a run to stop after the current cycle."""

from __future__ import annotations

import signal
import threading


class StopSignals:
    """While active, SIGTERM, SIGINT and SIGUSR1 ask the run to stop after the current cycle.

    Open MPI's mpirun kills its ranks within a second of its own SIGTERM or SIGINT but forwards
    SIGUSR1, so under mpirun the stop request is SIGUSR1 to mpirun. SIGTERM to the ranks alone
    (srun, which signals its tasks) is the same request. A SIGTERM that reaches mpirun too (SLURM's
    scancel and preemption signal every process of the job) ends the ranks before they can
    checkpoint: the job resumes from its last checkpoint. A second SIGINT stops at once without a
    checkpoint (an impatient Ctrl-C)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

    def __init__(self):
        self.received: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.received is not None:
            raise KeyboardInterrupt
        if self.received is None:
            self.received = signal.Signals(signum).name

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
