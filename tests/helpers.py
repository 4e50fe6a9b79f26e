"""The tests' shared helpers: run programs under a real ``mpirun`` with the interpreter running pytest.

A module of its own, not conftest.py, so that ``from helpers import ...`` finds these names whichever
other conftest.py a pytest session has loaded (experiments/tests has one too)."""

from __future__ import annotations

import atexit
import itertools
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from her_mpi.logger import read_progress  # noqa: F401  (the one progress.csv reader, for the tests)

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = Path(__file__).resolve().parent / "programs"
# Open MPI's session directories, one per launch (see mpi_env), all removed when this process ends
SESSION_DIRECTORIES = Path(tempfile.mkdtemp(prefix="her_mpi_tests_mpi."))
atexit.register(shutil.rmtree, SESSION_DIRECTORIES, ignore_errors=True)
_launches = itertools.count()


def ros_domain_id() -> int:
    """A random DDS domain (100-229) for one test's ROS 2 nodes, from a range of its own for each
    pytest-xdist worker (pytest.ini runs two), so that tests running at the same time never share one."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    width = 130 // workers
    low = 100 + (worker % workers) * width
    return random.randint(low, low + width - 1)


def mpi_env() -> dict:
    """The environment of one MPI launch, with a TMPDIR of its own for Open MPI's session files.

    A daemon or mpirun killed by a test leaves its session directory (``prted.<pid>``,
    ``ompi.<pid>``) behind, and Open MPI 5.0's PMIx refuses to start a later one that gets the same
    pid on the same host name ("The PMIx server's listener thread failed to start"; PMIx fixed it
    after 5.0.11, openpmix/openpmix#4046). The fake hosts' names are the same in every test, so with
    one shared /tmp the tests' own kills would fail later launches now and then."""
    tmpdir = SESSION_DIRECTORIES / f"launch{next(_launches)}"
    tmpdir.mkdir()
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1",
               PYTHONUNBUFFERED="1", TMPDIR=str(tmpdir))
    return env


def run_mpi(n: int, args: list[str], timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``mpirun -np n python ARGS`` with this interpreter; returns the finished process."""
    cmd = ["mpirun", "--oversubscribe", "-np", str(n), sys.executable, *map(str, args)]
    started = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=mpi_env(),
                            cwd=cwd or ROOT)
    result.elapsed = time.monotonic() - started
    return result


def run_python(args: list[str], timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The same program without mpirun (an MPI world of size 1)."""
    result = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                            timeout=timeout, env=mpi_env(), cwd=cwd or ROOT)
    return result


def measures_time_or_memory(column: str) -> bool:
    """progress.csv's clock and memory columns (``time_s``, ``learn_update_ms``, ``max_rss_mb``,
    ``wait_max_s``, ``steps_per_s``...): they differ between runs that learn identically."""
    return column.endswith(("_s", "_ms", "_mb"))


def learning_rows(run_dir: Path) -> list[dict]:
    """progress.csv without the columns that measure time or memory."""
    return [{k: v for k, v in row.items() if not measures_time_or_memory(k)} for row in read_progress(run_dir)]


def describe(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\n--- stdout ---\n{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-4000:]}"


# Tiny schedules for plumbing tests: a few updates, a few episodes.
TINY = ["--set", "train.n_cycles=2", "--set", "train.n_batches=3", "--set", "train.n_test_episodes=4",
        "--set", "train.batch_size=32", "--set", "log.tensorboard=false"]
