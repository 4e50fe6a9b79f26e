"""Checkpoints: everything needed to resume training exactly, written atomically and loaded safely.

A checkpoint (``checkpoints/latest.pt``, ``best.pt``, ``epoch_NNNN.pt``) is one ``torch.save``
file holding only tensors, numbers, strings, lists, tuples and dicts: the resolved config, the env
spec, the agent's networks, targets, optimizers and normalizers, the loop position and counters,
and every rank's own state (RNG streams, pending normalizer statistics, the metrics of a
partly finished epoch). It is loaded with ``torch.load(weights_only=True)``, so a file that would
run code when unpickled is refused instead of executed.

Each rank's replay buffer lives beside it in ``checkpoints/replay_rank<r>/`` (:class:`ReplayStore`):
the buffer is a ring of episodes, so a save writes segment files with only the episodes stored
since the previous save, then a small JSON manifest naming the segments that still hold live
episodes. Segment and manifest names carry the save's generation, which ``latest.pt`` records, so a
job killed at any moment leaves a ``latest.pt`` whose generation's manifest and segments are all on
disk. Replay files are plain ``.npy``/``.npz`` arrays loaded with ``allow_pickle=False``.

Every write goes to a temporary file in the same directory, is fsynced, then renamed over the old
one: a killed job never leaves a half-written file, and a failed write (disk full, read-only
directory) raises :class:`CheckpointWriteError` naming the path while the previous file stays.
"""

from __future__ import annotations

import io
import json
import pickle
import pickletools
import zipfile
from pathlib import Path

import numpy as np
import torch

from her_mpi.config import ConfigError
# the atomic file writes, re-exported: checkpoints are their main user
from her_mpi.files import (CheckpointWriteError, atomic_write, remove_stale_temporaries,  # noqa: F401
                           sync_directory)

FORMAT_VERSION = 2  # 2: safe (weights_only) checkpoints, loop position, per-rank state, replay generations
REPLAY_FORMAT = 1


# -- the safe subset ---------------------------------------------------------------------------------

def to_safe(value, where: str = "checkpoint"):
    """``value`` with numpy arrays as tensors and numpy scalars as Python numbers; anything that
    ``torch.load(weights_only=True)`` would refuse is a TypeError naming where it is."""
    if isinstance(value, np.generic):  # before float: np.float64 is a float subclass
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value).copy())
    if isinstance(value, dict):
        return {key: to_safe(item, f"{where}[{key!r}]") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [to_safe(item, f"{where}[{i}]") for i, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise TypeError(f"{where} is a {type(value).__name__}; checkpoints hold only tensors, arrays, "
                    f"numbers, strings, lists and dicts (so loading them never runs code)")


def save_checkpoint(path: Path, state: dict) -> int:
    """Write ``state`` (plus the format version) atomically; returns the bytes written."""
    safe = to_safe({"format": FORMAT_VERSION, **state})
    return atomic_write(path, lambda f: torch.save(safe, f))


def checkpoint_file(path: str | Path) -> Path:
    """A checkpoint file, or a run directory's ``checkpoints/latest.pt``."""
    path = Path(path)
    if path.is_dir():
        candidate = path / "checkpoints" / "latest.pt"
        if not candidate.is_file():
            candidate = path / "latest.pt"
        path = candidate
    return path


def not_a_checkpoint(path: Path) -> str | None:
    """Why the file at ``path`` cannot be a checkpoint, from its first bytes (None: it may be one)."""
    with path.open("rb") as f:
        head = f.read(4)
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":  # torch's zip archive, or a legacy pickle
        return None
    if not head:
        return "the file is empty"
    if path.suffix == ".onnx":
        return "it is an exported ONNX policy, not a training checkpoint (her_mpi.evaluate takes it with --policy)"
    return "it is not a file torch.save wrote (a checkpoint is a zip archive)"


def load_checkpoint(path: str | Path) -> dict:
    path = checkpoint_file(path)
    if not path.is_file():
        raise ConfigError(f"no checkpoint at {str(path)!r} (expected a file written by "
                          f"her_mpi.train, e.g. RUN_DIR/checkpoints/latest.pt)")
    if (problem := not_a_checkpoint(path)) is not None:
        raise ConfigError(f"{str(path)!r} is not a her_mpi checkpoint: {problem}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:  # weights_only refused something other than plain data
        version = peek_format(path)
        if version is not None and version != FORMAT_VERSION:
            raise ConfigError(format_mismatch(path, version)) from None
        first = str(exc).strip().splitlines()
        detail = next((line for line in first if "GLOBAL" in line or "Unsupported" in line), first[0] if first else "")
        raise ConfigError(f"refusing to load {str(path)!r}: it holds Python objects other than tensors, "
                          f"numbers, strings, lists and dicts, and unpickling it could run code "
                          f"({detail.strip()}). Only load checkpoints you wrote yourself with "
                          f"her_mpi >= format {FORMAT_VERSION}") from None
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise ConfigError(f"{str(path)!r} is not a readable her_mpi checkpoint: {exc}") from None
    if not isinstance(state, dict) or "format" not in state:
        raise ConfigError(f"{str(path)!r} is not a her_mpi checkpoint (no format version in it)")
    if state["format"] != FORMAT_VERSION:
        raise ConfigError(format_mismatch(path, state["format"]))
    state["path"] = str(path)
    return state


def format_mismatch(path: Path, version) -> str:
    if isinstance(version, int) and version < FORMAT_VERSION:
        return (f"{str(path)!r} is a checkpoint of format {version}, written by an older her_mpi; this "
                f"version reads format {FORMAT_VERSION} only. Resume or export it with the her_mpi "
                f"version that wrote it, or start a new run")
    return (f"{str(path)!r} is a checkpoint of format {version}, written by a newer her_mpi; this "
            f"version reads format {FORMAT_VERSION} only. Upgrade her_mpi to load it")


def peek_format(path: Path) -> int | None:
    """The ``format`` entry of a torch checkpoint, read from its pickle opcodes without executing
    any of them (used to name the version of a file that the safe loader refused)."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            if name is None:
                return None
            data = archive.read(name)
        previous = None
        for opcode, arg, _ in pickletools.genops(io.BytesIO(data)):
            if opcode.name in ("BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"):
                continue  # the key string memoized between the key and its value
            if previous == "format" and opcode.name in ("BININT", "BININT1", "BININT2", "INT", "LONG1"):
                return int(arg)
            previous = arg if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE") else None
    except Exception:  # noqa: BLE001 - not a torch zip file or a truncated one: unknown format
        return None
    return None


def check_compatible(state: dict, env_id: str, algo: str) -> None:
    """A checkpoint resumes only the env and algorithm it was trained on."""
    saved_env, saved_algo = state["config"]["env"]["id"], state["algo"]
    if saved_env != env_id or saved_algo != algo:
        raise ConfigError(f"checkpoint {state['path']!r} was trained with env {saved_env!r} and "
                          f"algo {saved_algo!r}, but the config asks for env {env_id!r} and algo "
                          f"{algo!r}")


# -- replay buffers: incremental, per rank ------------------------------------------------------------

def replay_dir(checkpoint_dir: Path, rank: int) -> Path:
    return Path(checkpoint_dir) / f"replay_rank{rank}"


class ReplayStore:
    """One rank's replay buffer on disk, saved incrementally.

    ``save(buffer, generation)`` writes the episodes stored since the last save as segments
    (``segment-g<generation>-<piece>.npz``: their slots and their rows of every episode array), the
    priorities when the buffer is prioritized (they change everywhere, so all of them), then the
    manifest ``manifest-g<generation>.json``: the ring position and the live segments in write
    order (a segment whose slots were all overwritten since is dropped). ``commit(generation)``
    deletes every older manifest and every file no longer referenced, once ``latest.pt`` records
    ``generation``; until then the previous generation stays loadable.
    """

    SEGMENT_EPISODES = 1000  # at most this many episodes per segment file

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.n_stored_saved = 0  # the buffer's n_stored at the last save
        self.segments: list[dict] = []  # {"file", "n_slots"} in write order
        self.owner: np.ndarray | None = None  # [capacity] index into segments of each slot's data
        self.last_stats: dict = {}

    def manifest_path(self, generation: int) -> Path:
        return self.directory / f"manifest-g{generation:08d}.json"

    # -- writing -------------------------------------------------------------------------------

    def save(self, buffer, generation: int) -> dict:
        """Write what changed since the last save; returns {"bytes", "episodes"} of this save."""
        if self.owner is None or len(self.owner) != buffer.capacity:
            self.owner = np.full(buffer.capacity, -1, np.int64)
            self.segments, self.n_stored_saved = [], 0
        written = 0
        slots = buffer.slots_stored_since(self.n_stored_saved)
        # In pieces of at most SEGMENT_EPISODES: the ring frees a piece once it has overwritten it
        # all, so a large save (the first one of a full buffer) never pins twice the buffer on disk.
        for piece, start in enumerate(range(0, len(slots), self.SEGMENT_EPISODES)):
            part = slots[start: start + self.SEGMENT_EPISODES]
            name = f"segment-g{generation:08d}-{piece:04d}.npz"
            arrays = {"slots": part.astype(np.int64),
                      **{field: array[part] for field, array in buffer.episode_fields().items()}}
            written += atomic_write(self.directory / name, lambda f: np.savez(f, **arrays))
            self.segments.append({"file": name, "n_slots": 0})
            self.owner[part] = len(self.segments) - 1
        live = np.bincount(self.owner[self.owner >= 0], minlength=len(self.segments))
        keep = np.flatnonzero(live)
        remap = np.full(len(self.segments), -1, np.int64)
        remap[keep] = np.arange(len(keep))
        self.owner = np.where(self.owner >= 0, remap[np.maximum(self.owner, 0)], -1)
        self.segments = [{"file": self.segments[i]["file"], "n_slots": int(live[i])} for i in keep]
        manifest = {"format": REPLAY_FORMAT, "generation": int(generation), "ring": buffer.ring_state(),
                    "fields": {field: [str(a.dtype), list(a.shape[1:])]
                               for field, a in buffer.episode_fields().items()},
                    "segments": self.segments, "priorities": None}
        leaves = buffer.priority_leaves()
        if leaves is not None:
            name = f"priorities-g{generation:08d}.npy"
            written += atomic_write(self.directory / name, lambda f: np.save(f, leaves, allow_pickle=False))
            manifest["priorities"] = name
        written += atomic_write(self.manifest_path(generation),
                                lambda f: f.write(json.dumps(manifest, indent=1)), mode="w")
        sync_directory(self.directory)
        self.n_stored_saved = int(buffer.n_stored)
        self.last_stats = {"bytes": written, "episodes": int(len(slots))}
        return self.last_stats

    def commit(self, generation: int) -> None:
        """``latest.pt`` now records ``generation``: delete what only older generations used."""
        manifest = self.manifest_path(generation)
        if not manifest.is_file():
            return
        referenced = {manifest.name, *(s["file"] for s in self.segments)}
        data = json.loads(manifest.read_text())
        referenced.update(s["file"] for s in data["segments"])
        if data.get("priorities"):
            referenced.add(data["priorities"])
        for path in self.directory.iterdir():
            if path.name not in referenced and (path.suffix in (".json", ".npz", ".npy", ".tmp")):
                path.unlink(missing_ok=True)

    # -- reading -------------------------------------------------------------------------------

    def has(self, generation: int) -> bool:
        return self.manifest_path(generation).is_file()

    def load(self, buffer, generation: int) -> None:
        """Restore ``buffer`` exactly as it was at ``generation``'s save; ValueError if the files
        do not fit it, ReplayFileError if they are unreadable or unsafe."""
        path = self.manifest_path(generation)
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ReplayFileError(f"{path}: unreadable replay manifest ({exc})") from None
        if manifest.get("format") != REPLAY_FORMAT:
            raise ReplayFileError(f"{path}: replay manifest of format {manifest.get('format')}; this "
                                  f"her_mpi reads format {REPLAY_FORMAT}")
        fields = buffer.episode_fields()
        expected = {f: [str(a.dtype), list(a.shape[1:])] for f, a in fields.items()}
        ring = manifest["ring"]
        if manifest["fields"] != expected or ring["capacity"] != buffer.capacity:
            raise ValueError(f"saved replay buffer ({ring['capacity']} episodes of {manifest['fields']}) "
                             f"does not fit this buffer ({buffer.capacity} episodes of {expected}); "
                             f"resume with the replay and env settings the run was trained with")
        owner = np.full(buffer.capacity, -1, np.int64)
        for index, segment in enumerate(manifest["segments"]):
            data = read_arrays(self.directory / segment["file"])
            slots = data.pop("slots")
            for field, array in fields.items():
                array[slots] = data[field]
            owner[slots] = index
        leaves = None
        if manifest["priorities"]:
            leaves = read_arrays(self.directory / manifest["priorities"])["array"]
        buffer.restore_ring(ring, leaves)
        self.owner, self.segments = owner, [dict(s) for s in manifest["segments"]]
        self.n_stored_saved = int(ring["n_stored"])


class ReplayFileError(ConfigError):
    """A replay file that cannot be read safely."""


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """A ``.npz`` or ``.npy`` file's arrays, refusing pickled objects (they could run code)."""
    try:
        with open(path, "rb") as f:
            loaded = np.load(f, allow_pickle=False)
            if isinstance(loaded, np.ndarray):
                return {"array": loaded}
            with loaded:
                return {name: loaded[name] for name in loaded.files}
    except ValueError as exc:
        if "allow_pickle" in str(exc) or "Object arrays" in str(exc):
            raise ReplayFileError(f"refusing to load {path}: it holds pickled Python objects, and "
                                  f"unpickling them could run code (replay files hold plain arrays only)") from None
        raise ReplayFileError(f"{path}: unreadable replay file ({exc})") from None
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise ReplayFileError(f"{path}: unreadable replay file ({exc})") from None
