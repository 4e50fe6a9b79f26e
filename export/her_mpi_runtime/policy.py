"""Run an exported her_mpi policy with numpy and onnxruntime only (no torch, MPI or MuJoCo)."""

from __future__ import annotations

import hashlib
import json
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from her_mpi_runtime.zoo import resolve


FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32 = np.dtype(np.float32)


class PolicyInputError(ValueError):
    """An observation or goal of the wrong shape, type or with non-finite values."""


@dataclass(frozen=True)
class PolicyMetadata:
    algo: str
    env_id: str
    obs_dim: int
    goal_dim: int
    action_dim: int
    discrete: bool
    n_actions: int
    action_low: np.ndarray  # empty for discrete policies
    action_high: np.ndarray
    control_period_s: float
    train_env_steps: int
    test_success_rate: float
    her_mpi_version: str
    raw: dict  # every metadata entry as stored, including the training config (JSON)

    @property
    def rate_hz(self) -> float:
        return 1.0 / self.control_period_s if self.control_period_s > 0 else 0.0

    @property
    def training_config(self) -> dict:
        return json.loads(self.raw.get("training_config", "{}"))

    @classmethod
    def from_map(cls, raw: dict, path: str) -> "PolicyMetadata":
        missing = [k for k in ("algo", "env_id", "obs_dim", "goal_dim", "action_dim", "action_type") if k not in raw]
        if missing:
            raise ValueError(f"{path} is not a her_mpi policy: metadata lacks {', '.join(missing)} "
                             f"(export it with python -m her_mpi.export)")
        return cls(
            algo=raw["algo"], env_id=raw["env_id"], obs_dim=int(raw["obs_dim"]), goal_dim=int(raw["goal_dim"]),
            action_dim=int(raw["action_dim"]), discrete=raw["action_type"] == "discrete",
            n_actions=int(raw.get("n_actions", 0)),
            action_low=np.asarray(json.loads(raw.get("action_low", "[]")), np.float32),
            action_high=np.asarray(json.loads(raw.get("action_high", "[]")), np.float32),
            control_period_s=float(raw.get("control_period_s", 0.0)),
            train_env_steps=int(raw.get("train_env_steps", 0)),
            test_success_rate=float(raw.get("test_success_rate", "nan")),
            her_mpi_version=raw.get("her_mpi_version", "?"), raw=dict(raw))


class Policy:
    """A loaded ONNX policy: ``act(observation, desired_goal)`` for one input or a batch.

    One input (1-D arrays) gives one action (1-D); a batch ([n, dim] arrays) gives [n, action_dim].
    Inputs are validated: wrong sizes, non-numeric values and NaN/Inf raise PolicyInputError.
    """

    def __init__(self, path: str | Path, intra_op_threads: int = 1):
        """``path``: an .onnx file from ``python -m her_mpi.export``, or ``zoo:NAME`` for a policy that
        ships with this package (``python -m her_mpi_runtime.zoo`` lists them); ``intra_op_threads``:
        onnxruntime's threads for one call (0: its default)."""
        if not isinstance(path, (str, Path)):
            raise TypeError(f"path must be an .onnx file path or 'zoo:NAME', got {path!r}")
        if isinstance(intra_op_threads, bool) or not isinstance(intra_op_threads, (int, np.integer)) \
                or intra_op_threads < 0:
            raise ValueError(f"intra_op_threads must be an integer >= 0 (0: onnxruntime's default), "
                             f"got {intra_op_threads!r}")
        path = resolve(path)
        if not path.is_file():
            raise FileNotFoundError(f"no policy file at {str(path)!r}")
        # The model is read once and hashed from the very bytes onnxruntime loads, so the id that
        # diagnostics report is the file that runs (not one replaced on disk since).
        model_bytes = path.read_bytes()
        self.sha256 = hashlib.sha256(model_bytes).hexdigest()
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(intra_op_threads)  # one thread: lowest latency at batch 1
        options.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises several types for bad files
            raise ValueError(f"{str(path)!r} is not a loadable ONNX model: {exc}") from None
        self.path = path
        self.metadata = PolicyMetadata.from_map(self.session.get_modelmeta().custom_metadata_map, str(path))
        self._output = ["action"]
        self._bind_single_input()

    @property
    def identity(self) -> dict:
        """What identifies the running policy: file hash, env, algorithm, training steps."""
        meta = self.metadata
        return {"sha256": self.sha256, "env_id": meta.env_id, "algo": meta.algo,
                "train_env_steps": meta.train_env_steps, "path": str(self.path),
                "her_mpi_version": meta.her_mpi_version}

    def _bind_single_input(self) -> None:
        """Batch-1 calls (every controller tick) run on buffers bound once, zero-copy: a few µs
        less than ``session.run``, which wraps the inputs and allocates the output every call.
        Observation and goal share one buffer, so one call checks both for NaN/Inf."""
        meta = self.metadata
        self._single_inputs = np.zeros(meta.obs_dim + meta.goal_dim, np.float32)
        self._single_obs = self._single_inputs[:meta.obs_dim].reshape(1, meta.obs_dim)
        self._single_goal = self._single_inputs[meta.obs_dim:].reshape(1, meta.goal_dim)
        self._single_shapes = ((meta.obs_dim,), (meta.goal_dim,))
        self._n_obs = meta.obs_dim
        action_width = self.session.get_outputs()[0].shape[1]
        action_type = np.int64 if meta.discrete else np.float32
        self._single_action = np.zeros((1, action_width), action_type)
        binding = self.session.io_binding()
        binding.bind_cpu_input("observation", self._single_obs)
        binding.bind_cpu_input("desired_goal", self._single_goal)
        binding.bind_output("action", "cpu", 0, action_type, list(self._single_action.shape),
                            self._single_action.ctypes.data)
        self._binding = binding
        self._single_lock = threading.Lock()  # the bound buffers are shared: one call at a time

    def act(self, observation, desired_goal) -> np.ndarray:
        if type(observation) is np.ndarray and type(desired_goal) is np.ndarray and observation.dtype is _FLOAT32 \
                and desired_goal.dtype is _FLOAT32 and (observation.shape, desired_goal.shape) == self._single_shapes:
            # a controller's tick: one float32 vector each, copied into the bound buffer and checked there
            inputs, n = self._single_inputs, self._n_obs
            with self._single_lock:
                inputs[:n], inputs[n:] = observation, desired_goal
                if np.isfinite(inputs).all():
                    self.session.run_with_iobinding(self._binding)
                    return self._single_action[0].copy()
        return self._act_checked(observation, desired_goal)

    __call__ = act

    def _act_checked(self, observation, desired_goal) -> np.ndarray:
        """Any input: validated (the error names what is wrong), then one call or a batch."""
        meta = self.metadata
        obs = self._validated("observation", observation, meta.obs_dim)
        goal = self._validated("desired_goal", desired_goal, meta.goal_dim)
        single = obs.ndim == 1
        if single != (goal.ndim == 1):
            raise PolicyInputError("observation and desired_goal must both be single vectors or both batches")
        if single:
            with self._single_lock:
                self._single_obs[0], self._single_goal[0] = obs, goal
                self.session.run_with_iobinding(self._binding)
                return self._single_action[0].copy()
        if len(obs) != len(goal):
            raise PolicyInputError(f"batch sizes differ: {len(obs)} observations, {len(goal)} goals")
        return self.session.run(self._output, {"observation": obs, "desired_goal": goal})[0]

    @staticmethod
    def _validated(name: str, value, dim: int) -> np.ndarray:
        if type(value) is np.ndarray and value.dtype == np.float32 and value.flags.c_contiguous:
            array = value  # the common case (every controller tick): no copy
        else:
            array = _as_float32(name, value)
        if array.ndim not in (1, 2) or array.shape[-1] != dim:
            raise PolicyInputError(f"{name} must have shape [{dim}] or [batch, {dim}], got {list(array.shape)}")
        if not np.isfinite(array).all():
            raise PolicyInputError(f"{name} contains NaN or Inf: {_shown(array)}")
        return array


def _as_float32(name: str, value) -> np.ndarray:
    """``value`` as a C-contiguous float32 array, refusing what a cast would silently change:
    non-numbers (strings, bools, complex, dates, objects) and finite values beyond float32's range
    (the cast would turn them into Inf)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            array = np.asarray(value)
    except (TypeError, ValueError, OverflowError, Warning) as exc:
        raise PolicyInputError(f"{name} must be numeric, got {type(value).__name__}: {exc}") from None
    if array.dtype.kind not in "iuf":
        raise PolicyInputError(f"{name} must be numeric (integers or floats), got {type(value).__name__} "
                               f"of dtype {array.dtype}: {_shown(array)}")
    if array.dtype.kind == "f" and array.dtype.itemsize > 4 and array.size:
        finite = np.abs(array[np.isfinite(array)])
        if finite.size and finite.max() > FLOAT32_MAX:
            raise PolicyInputError(f"{name} holds {finite.max():g}, beyond float32's range (|x| <= {FLOAT32_MAX:.4g}): "
                                   f"{_shown(array)}")
    return np.ascontiguousarray(array, dtype=np.float32)


def _shown(array: np.ndarray):
    return array.tolist() if array.size <= 32 else f"array of shape {list(array.shape)}"
