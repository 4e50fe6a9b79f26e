"""Train normally, but let the test control and observe this job from outside.

    mpirun -np 2 python tests/programs/train_signalled.py [her_mpi.train arguments]

Environment variables (all optional):

* ``SIGNAL_AT="RANK:CYCLE:SIGNAME"``: that rank sends itself the signal (a real one, through the
  kernel) during the learning step of its CYCLE-th cycle in this process (1-based), e.g.
  ``1:2:SIGTERM``; several separated by commas.
* ``KILL_AT="RANK:CYCLE"``: that rank kills itself with SIGKILL there instead (no Python cleanup),
  after writing the time to ``PID_DIR/killed_at``.
* ``PID_DIR=DIR``: each rank writes its pid to ``DIR/rank<r>.pid`` once training starts.
* ``FAIL_WRITE="RANK:NAME:NTH:MODE"``: that rank's NTH atomic write of a file whose name starts
  with NAME (``latest.pt``, ``segment``) writes some bytes, then fails like a full disk
  (MODE ``enospc``: OSError ENOSPC) or dies (MODE ``kill``: SIGKILL in the middle of the write).
"""

import errno
import os
import signal
import sys
import time
from pathlib import Path

import her_mpi.checkpoint as checkpoint
from her_mpi import mpi
from her_mpi.train import main
from her_mpi.trainer import Trainer


def parse(variable: str) -> list[list[str]]:
    return [item.split(":") for item in os.environ.get(variable, "").split(",") if item]


SIGNALS = {(int(r), int(c)): getattr(signal, name) for r, c, name in parse("SIGNAL_AT")}
KILLS = {(int(r), int(c)) for r, c in parse("KILL_AT")}
original_run = Trainer.run


def run(self, *args, **kwargs):
    if os.environ.get("PID_DIR"):
        pid_dir = Path(os.environ["PID_DIR"])
        pid_dir.mkdir(parents=True, exist_ok=True)
        (pid_dir / f"rank{mpi.rank()}.pid").write_text(str(os.getpid()))
    learn, calls = self.agent.learn, {"n": 0}

    def learn_and_signal(episodes):
        calls["n"] += 1
        key = (mpi.rank(), calls["n"])
        if key in KILLS:
            Path(os.environ["PID_DIR"], "killed_at").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        if key in SIGNALS:
            os.kill(os.getpid(), SIGNALS[key])
        return learn(episodes)

    self.agent.learn = learn_and_signal
    return original_run(self, *args, **kwargs)


Trainer.run = run

FAILURES = {(int(r), name): (int(nth), mode) for r, name, nth, mode in parse("FAIL_WRITE")}
original_atomic_write = checkpoint.atomic_write
writes: dict = {}


def atomic_write(path, write, mode="wb"):
    for (rank, name), (nth, how) in FAILURES.items():
        if rank == mpi.rank() and Path(path).name.startswith(name):
            writes[name] = writes.get(name, 0) + 1
            if writes[name] == nth:
                def fail(f):
                    f.write(b"partial" if "b" in mode else "partial")
                    f.flush()
                    if how == "kill":
                        os.kill(os.getpid(), signal.SIGKILL)
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

                return original_atomic_write(path, fail, mode)
    return original_atomic_write(path, write, mode)


checkpoint.atomic_write = atomic_write
sys.exit(main(sys.argv[1:]))
