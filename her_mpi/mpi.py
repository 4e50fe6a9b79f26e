"""The only module that touches mpi4py.

Every rank runs the same program on its own environments and replay buffer. Ranks meet in a few
collectives: broadcast of rank 0's parameters at start, one allreduce-mean of all the networks'
gradients every update (her_mpi.optim.GradientGroup), an allreduce of normalizer statistics every cycle, and averages of logged
metrics. Without ``mpirun`` everything works with a world of size 1.

A rank that raises must not leave the others waiting forever in a collective:
:func:`run_guarded` prints the rank's traceback and aborts the whole job. A rank that stops
answering (a frozen host, a network partition) must not either: every collective marks this rank
as waiting, and the :class:`Watchdog` thread ends the rank once a wait outlasts
``train.hang_timeout_s``, after asking its peers where they are, so that the message names the
ranks that did not answer.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from mpi4py import MPI

COMM = MPI.COMM_WORLD


def rank() -> int:
    return COMM.Get_rank()


def size() -> int:
    return COMM.Get_size()


def is_root() -> bool:
    return COMM.Get_rank() == 0


# -- waiting on peers ----------------------------------------------------------------------------


class Waits:
    """What this rank's main thread waits for right now, read by the :class:`Watchdog` thread.

    Every collective below runs between :meth:`enter` and :meth:`leave`: two attribute writes and
    a clock read, nothing a gradient update can measure. ``count`` numbers the collectives, which
    every rank runs in the same order, so ranks waiting in the same one report the same number."""

    def __init__(self):
        self.phase = "start-up"  # what the loop is doing (set by the trainer), for messages
        self.phase_since = time.monotonic()
        self.collective: str | None = None
        self.since: float | None = None  # time.monotonic() when the current wait began
        self.count = 0
        self.longest = 0.0  # the longest wait so far (the trainer logs and resets it per epoch)

    def enter(self, collective: str) -> None:
        self.collective, self.count, self.since = collective, self.count + 1, time.monotonic()

    def leave(self) -> None:
        waited = time.monotonic() - self.since
        if waited > self.longest:
            self.longest = waited
        self.since = None

    def set_phase(self, phase: str) -> None:
        self.phase, self.phase_since = phase, time.monotonic()

    def take_longest(self) -> float:
        """The longest wait since the last call (this rank's)."""
        longest, self.longest = self.longest, 0.0
        return longest

    def snapshot(self) -> dict:
        since, now = self.since, time.monotonic()
        return {"rank": rank(), "host": socket.gethostname(), "collective": self.collective if since else None,
                "count": self.count, "waiting_s": now - since if since else 0.0, "phase": self.phase,
                "phase_s": now - self.phase_since}


WAITS = Waits()


def set_phase(phase: str) -> None:
    WAITS.set_phase(phase)


def _collective(name: str, call, *args):
    WAITS.enter(name)
    try:
        return call(*args)
    finally:
        WAITS.leave()


def allreduce_mean_(array: np.ndarray) -> np.ndarray:
    """Average a contiguous array over ranks, in place (the array may be a view of a tensor)."""
    if COMM.Get_size() > 1:
        _collective("allreduce", COMM.Allreduce, MPI.IN_PLACE, array, MPI.SUM)
        array /= COMM.Get_size()
    return array


def start_allreduce_mean_(array: np.ndarray):
    """Begin averaging ``array`` over ranks in place; finish with :func:`finish_allreduce_mean_`.

    Lets a rank compute its next gradient while it waits for the slowest rank."""
    if COMM.Get_size() == 1:
        return None
    return COMM.Iallreduce(MPI.IN_PLACE, array, op=MPI.SUM)


def finish_allreduce_mean_(request, array: np.ndarray) -> np.ndarray:
    if request is not None:
        _collective("gradient allreduce", request.Wait)
        array /= COMM.Get_size()
    return array


def allreduce_sum_(array: np.ndarray) -> np.ndarray:
    if COMM.Get_size() > 1:
        _collective("allreduce", COMM.Allreduce, MPI.IN_PLACE, array, MPI.SUM)
    return array


def max_over_ranks(value: float) -> float:
    if COMM.Get_size() == 1:
        return float(value)
    return float(_collective("allreduce", COMM.allreduce, float(value), MPI.MAX))


def processor_names() -> list[str]:
    """Every rank's host (MPI's processor name), in rank order (collective)."""
    return allgather_object(MPI.Get_processor_name())


def die_with_launcher() -> None:
    """Under a launcher (mpirun, srun), have the kernel kill this rank when the process that started
    it dies: a rank never outlives its job (SLURM's linuxproc tracking, for one, loses a rank that
    its launcher left behind, and the rank would go on writing checkpoints). Linux only."""
    if not any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "SLURM_STEP_ID")):
        return
    parent = os.getppid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    pr_set_pdeathsig = 1
    if prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) == 0 and os.getppid() != parent:
        os._exit(1)  # the launcher died before the request took effect (exit 1: killed)


def broadcast_(array: np.ndarray, root: int = 0) -> np.ndarray:
    if COMM.Get_size() > 1:
        _collective("broadcast", COMM.Bcast, array, root)
    return array


def oversubscribed() -> bool:
    """Whether any node runs more ranks than it has cores (collective): then ranks take turns on
    the cores and every collective also waits for a descheduled rank."""
    if COMM.Get_size() == 1:
        return False
    node = _collective("split by node", COMM.Split_type, MPI.COMM_TYPE_SHARED)
    crowded = node.Get_size() > (os.cpu_count() or 1)
    node.Free()
    return bool(_collective("allreduce", COMM.allreduce, int(crowded), MPI.MAX))


def barrier() -> None:
    if COMM.Get_size() > 1:
        _collective("barrier", COMM.Barrier)


def broadcast_object(obj, root: int = 0):
    return _collective("broadcast", COMM.bcast, obj, root) if COMM.Get_size() > 1 else obj


def gather_object(obj, root: int = 0) -> list | None:
    return _collective("gather", COMM.gather, obj, root) if COMM.Get_size() > 1 else [obj]


def allgather_object(obj) -> list:
    return _collective("allgather", COMM.allgather, obj) if COMM.Get_size() > 1 else [obj]


def mean_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Average a dict of scalars over ranks (every rank must pass the same keys).

    The keys travel with the values (a sorted tuple, allgathered once per call: this runs once
    per epoch), so a rank with another set of keys is a clear error on every rank, not a silent
    average of mismatched entries."""
    keys = sorted(values)
    if COMM.Get_size() > 1:
        everyone = allgather_object(tuple(keys))
        if any(k != everyone[0] for k in everyone):
            raise ValueError("mean_over_ranks: ranks passed different keys: "
                             + describe_key_differences([set(k) for k in everyone]))
    vector = np.array([float(values[k]) for k in keys], dtype=np.float64)
    allreduce_mean_(vector)
    return dict(zip(keys, vector.tolist()))


def describe_key_differences(key_sets: list[set]) -> str:
    """E.g. "rank 1 lacks 'test_return'; rank 1 has extra 'q_max'" (relative to all ranks' union)."""
    union, common = set().union(*key_sets), set.intersection(*key_sets)
    parts = []
    for r, keys in enumerate(key_sets):
        missing, extra = sorted(union - keys), sorted(keys - common)
        if missing:
            parts.append(f"rank {r} lacks {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"rank {r} has {', '.join(map(repr, extra))}, which not every rank has")
    return "; ".join(parts)


def digest(arrays: dict[str, np.ndarray]) -> dict[str, str]:
    return {name: hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()
            for name, a in arrays.items()}


def assert_identical_across_ranks(arrays: dict[str, np.ndarray]) -> None:
    """Raise if any named array differs bit-wise between ranks (a cheap digest exchange)."""
    if COMM.Get_size() == 1:
        return
    mine = digest(arrays)
    everyone = allgather_object(mine)
    differing = sorted({name for d in everyone for name in d if d[name] != mine.get(name)})
    if differing:
        raise RuntimeError(f"ranks diverged: {', '.join(differing)} differ between ranks "
                           f"(rank {rank()} sees {len(everyone)} digests)")


def run_guarded(main: Callable[[], int | None], on_crash: Callable[[str], None] | None = None) -> int:
    """Run ``main``; on an uncaught exception print this rank's traceback and abort every rank.

    Without this, a rank that dies while the others sit in an Allreduce hangs the job until the
    wall-clock limit. ``SystemExit`` passes through so user errors exit cleanly with their code.
    ``on_crash(traceback_text)`` runs first (best effort: it records the crash).
    """
    try:
        return main() or 0
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - anything, including KeyboardInterrupt, must abort
        text = traceback.format_exc()
        prefix = f"[her_mpi rank {rank()}/{size()}] "
        sys.stderr.write("".join(prefix + line + "\n" for line in text.rstrip().splitlines()))
        sys.stderr.flush()
        if on_crash is not None:
            try:
                on_crash(text)
            except Exception:  # noqa: BLE001 - the abort below must happen whatever the record does
                pass
        if COMM.Get_size() > 1:
            COMM.Abort(1)
        os._exit(1)


# -- hung peers ------------------------------------------------------------------------------------

QUESTION, ANSWER = 1, 2  # tags of the watchdogs' own messages, on a communicator of their own
SUSPENDED_S = 2.0  # a poll this much later than due: this process was not running in between


@dataclass
class HangReport:
    """A wait that outlasted the timeout: where this rank waited, and what each peer answered."""

    me: dict  # this rank's Waits.snapshot()
    answers: dict[int, dict] = field(default_factory=dict)  # rank -> its snapshot, for the ranks that answered
    n_ranks: int = 1
    reply_window_s: float = 0.0

    @property
    def silent(self) -> list[int]:
        return [r for r in range(self.n_ranks) if r != self.me["rank"] and r not in self.answers]

    @property
    def waiting_with_me(self) -> list[int]:
        return sorted([self.me["rank"]] + [r for r, a in self.answers.items() if a["count"] == self.me["count"]
                                           and a["collective"] is not None])

    @property
    def reporter(self) -> int:
        """The rank that writes the record and the full message: the lowest one waiting here."""
        return self.waiting_with_me[0]

    def describe(self) -> str:
        me = self.me
        parts = [f"rank {me['rank']} ({me['host']}) waited {me['waiting_s']:.0f} s for its peers in "
                 f"{me['collective']} #{me['count']} during {me['phase']}"]
        if self.silent:
            parts.append(f"{ranks_text(self.silent)} did not answer within {self.reply_window_s:.0f} s "
                         "(a frozen process or host, or a network partition)")
        for r, a in sorted(self.answers.items()):
            if a["collective"] is None:
                parts.append(f"rank {r} ({a['host']}) answered but is not waiting: it has been in {a['phase']} for "
                             f"{a['phase_s']:.0f} s (stuck, or slower than the timeout allows)")
            elif a["count"] != me["count"]:
                parts.append(f"rank {r} ({a['host']}) waits in another collective, {a['collective']} #{a['count']} "
                             f"during {a['phase']}: the ranks' collectives no longer match")
        waiting = self.waiting_with_me
        if len(waiting) > 1:
            parts.append(f"{ranks_text(waiting)} wait in the same collective")
        return "; ".join(parts)


def ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


class Watchdog:
    """A thread that ends this rank when it waits on its peers longer than ``timeout_s``.

    It wakes every ``poll_s``; while the main thread sits in a collective for longer than the
    timeout, it asks every other rank's watchdog where that rank is (on a duplicate communicator,
    so its messages never mix with training's) and collects the answers for ``reply_window_s``;
    then it calls ``on_hang(report)``, which must end the process. It also answers its peers'
    questions. Start and stop it collectively (``start`` duplicates the communicator); with one
    rank it does nothing."""

    def __init__(self, timeout_s: float, on_hang: Callable[[HangReport], None], reply_window_s: float | None = None):
        self.timeout_s, self.on_hang = float(timeout_s), on_hang
        self.reply_window_s = reply_window_s if reply_window_s is not None else min(10.0, max(2.0, timeout_s / 4))
        self.poll_s = min(1.0, max(0.05, self.timeout_s / 20))
        self.comm = None
        self._sends: list = []  # requests of messages in flight (their buffers must live until sent)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Watchdog":
        if COMM.Get_size() > 1 and self.timeout_s > 0:
            self.comm = COMM.Dup()
            self._thread = threading.Thread(target=self._watch, name="her_mpi-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Collective: every rank stops its watchdog (a rank still answering questions until all have)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.comm.Free()

    def _watch(self) -> None:
        last = time.monotonic()
        paused, paused_in = 0.0, None  # seconds this process itself did not run during the current wait
        while not self._stop.wait(self.poll_s):
            now = time.monotonic()
            since, count = WAITS.since, WAITS.count
            if paused_in != count:
                paused, paused_in = 0.0, count
            if now - last > self.poll_s + SUSPENDED_S:  # the whole process was stopped (SIGSTOP, a suspended
                paused += now - last - self.poll_s     # job or VM): the time is not its peers' silence
            last = now
            self._answer_questions()
            if since is not None and now - since - paused > self.timeout_s and WAITS.count == count:
                self.on_hang(self._ask_peers())
                return

    def _answer_questions(self) -> None:
        status = MPI.Status()
        while self.comm.iprobe(source=MPI.ANY_SOURCE, tag=QUESTION, status=status):
            source = status.Get_source()
            self.comm.recv(source=source, tag=QUESTION)
            self._send(WAITS.snapshot(), source, ANSWER)

    def _send(self, message, dest: int, tag: int) -> None:
        """Send without waiting (a frozen peer never receives): keep the request until it completes."""
        self._sends = [r for r in self._sends if not r.Test()]
        self._sends.append(self.comm.isend(message, dest=dest, tag=tag))

    def _ask_peers(self) -> HangReport:
        report = HangReport(WAITS.snapshot(), n_ranks=COMM.Get_size(), reply_window_s=self.reply_window_s)
        for peer in range(report.n_ranks):
            if peer != report.me["rank"]:
                self._send(report.me["count"], peer, QUESTION)
        deadline, status = time.monotonic() + self.reply_window_s, MPI.Status()
        while time.monotonic() < deadline and len(report.answers) < report.n_ranks - 1:
            self._answer_questions()  # the others ask at the same time
            while self.comm.iprobe(source=MPI.ANY_SOURCE, tag=ANSWER, status=status):
                source = status.Get_source()
                report.answers[source] = self.comm.recv(source=source, tag=ANSWER)
            time.sleep(0.02)
        return report
