"""Checkpoints: everything needed to resume training, written atomically.

A checkpoint is one ``torch.save`` file holding the resolved config, the env spec, the agent's
networks, targets, optimizers and normalizers, the loop counters and every rank's RNG states.
Replay buffers are large and per rank, so they are optional side files
(``replay_rank<r>.npz``). A killed job never leaves a half-written file: writes go to a temporary
file in the same directory, are fsynced, then renamed over the old one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from her_mpi.config import ConfigError

FORMAT_VERSION = 1


def atomic_write(path: Path, write: Callable[[object], None], mode: str = "wb") -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make outputs unreadable to others
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(path: Path, state: dict) -> None:
    atomic_write(path, lambda f: torch.save({"format": FORMAT_VERSION, **state}, f))


def load_checkpoint(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        candidate = path / "checkpoints" / "latest.pt"
        if not candidate.is_file():
            candidate = path / "latest.pt"
        path = candidate
    if not path.is_file():
        raise ConfigError(f"no checkpoint at {str(path)!r} (expected a file written by "
                          f"her_mpi.train, e.g. RUN_DIR/checkpoints/latest.pt)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise ConfigError(f"{str(path)!r} is not a readable her_mpi checkpoint: {exc}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
        raise ConfigError(f"{str(path)!r} is not a her_mpi checkpoint of format {FORMAT_VERSION}")
    state["path"] = str(path)
    return state


def check_compatible(state: dict, env_id: str, algo: str) -> None:
    """A checkpoint resumes only the env and algorithm it was trained on."""
    saved_env, saved_algo = state["config"]["env"]["id"], state["algo"]
    if saved_env != env_id or saved_algo != algo:
        raise ConfigError(f"checkpoint {state['path']!r} was trained with env {saved_env!r} and "
                          f"algo {saved_algo!r}, but the config asks for env {env_id!r} and algo "
                          f"{algo!r}")


def replay_path(checkpoint_dir: Path, rank: int) -> Path:
    return Path(checkpoint_dir) / f"replay_rank{rank}.npz"


def save_replay(path: Path, state: dict) -> None:
    atomic_write(path, lambda f: np.savez(f, **{k: np.asarray(v) for k, v in state.items()}))


def load_replay(path: Path) -> dict:
    with np.load(path) as data:
        return {k: data[k] if data[k].ndim else data[k].item() for k in data.files}
