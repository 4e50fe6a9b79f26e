"""Declaring settings: the vocabulary every config section is written in, and the sections
shared by every algorithm.

A key is a dataclass field made by :func:`setting`: its type, its default and a one-line
description side by side (``python -m her_mpi.train --list-keys`` prints them). A section checks
its values in ``validate(path)`` with :func:`check`, which raises :class:`ConfigError` naming the
dotted key. Algorithms declare their ``algo`` section the same way in their own modules.

This module imports nothing from the package. Algorithms, networks and envs import it rather
than the loader (:mod:`her_mpi.config`), which finds the algorithms through
:mod:`her_mpi.registry`: the imports run one way, config -> registry -> algorithms -> settings.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, NamedTuple


class ConfigError(ValueError):
    """A user-fixable mistake in a config file, an override or a command-line argument."""


class UnusedSettingWarning(UserWarning):
    """A setting given a value that has no effect (see :class:`Unused`)."""


class Unused(NamedTuple):
    """Why a key has no effect with the chosen algorithm and settings.

    An algorithm section's ``unused_keys(config)`` maps dotted keys (a section's name covers all
    of its keys) to these. A recipe or ``--set`` that gives such a key a value other than its
    default is refused; with ``refuse=False`` (the keys of a feature an ablation switches off, as
    ``algo.hindsight: false`` on a recipe tuned with hindsight) it is loaded with an
    :class:`UnusedSettingWarning`."""

    reason: str
    refuse: bool = True


# ---------------------------------------------------------------------------------------------
# Declaring keys
# ---------------------------------------------------------------------------------------------


def setting(default: Any = dataclasses.MISSING, help: str = "", *, factory: Callable[[], Any] | None = None):
    """A config key: a dataclass field with its one-line description beside its default.

    ``setting(0.95, "target <- polyak * target + (1 - polyak) * online")``. A list or dict
    default is copied for every instance; ``factory`` builds the default of a nested section.
    A subclass that only changes a default may redeclare the field plainly (``n_critics: int =
    1``): the description is looked up along the class hierarchy (:func:`key_help`)."""
    if not help:
        raise TypeError("setting() needs a help text: the one line --list-keys prints for the key")
    metadata = {"help": help}
    if factory is None and isinstance(default, (list, dict)):
        factory = lambda value=default: copy.deepcopy(value)  # noqa: E731
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def key_help(cls: type, name: str) -> str:
    """The description of key ``name`` of section class ``cls``: the nearest class in its
    hierarchy that declared the field with :func:`setting`."""
    for klass in cls.__mro__:
        declared = getattr(klass, "__dataclass_fields__", {}).get(name)
        if declared is not None and declared.metadata.get("help"):
            return declared.metadata["help"]
    return ""


def renamed_keys(cls: type) -> dict[str, str]:
    """Deprecated key -> current key of a section class (its ``RENAMED``, along its hierarchy)."""
    renamed: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        renamed.update(klass.__dict__.get("RENAMED", {}))
    return renamed


# ---------------------------------------------------------------------------------------------
# Sections shared by every algorithm
# ---------------------------------------------------------------------------------------------


@dataclass
class EnvConfig:
    id: str = setting("FetchReach-v4", "goal environment id: FetchReach/Push/PickAndPlace/Slide-v4, HandReach-v3, "
                                       "BitFlipping-v0, PredatorPrey-v0, Fetch*Discrete-v0, MsPacmanGoal-v0, or any "
                                       "gymnasium goal env")
    kwargs: dict = setting({}, "keyword arguments for the env's constructor, e.g. {n_bits: 10} for BitFlipping-v0")
    max_episode_steps: int | None = setting(None, "steps per episode (T); null: the env's registered horizon")

    def validate(self, path: str) -> None:
        check(self.max_episode_steps is None or self.max_episode_steps >= 1,
               f"{path}.max_episode_steps", self.max_episode_steps, "an integer >= 1 or null")


@dataclass
class TrainConfig:
    """The schedule: epochs -> cycles -> (collect episodes, learn); evaluation after each epoch."""

    n_epochs: int = setting(50, "epochs to train; each epoch ends with an evaluation and a checkpoint")
    n_cycles: int = setting(50, "cycles per epoch; a cycle collects rollouts_per_rank episodes per rank, then learns")
    n_batches: int = setting(40, "gradient updates per cycle (off-policy algorithms; on-policy ones learn once per "
                                 "cycle)")
    batch_size: int = setting(256, "transitions per gradient update, per rank (off-policy algorithms)")
    rollouts_per_rank: int = setting(2, "episodes each rank collects per cycle, in as many parallel envs")
    # The baselines schedule runs n_batches updates per cycle whatever the rank count, so N ranks
    # make N times fewer updates per env step than one rank (Push fails at np=1 and needs about 1M
    # steps at np=19). Naming the rank count a recipe was tuned at keeps what it learns from constant.
    schedule_ranks: int | None = setting(None, "off-policy algorithms: the rank count n_batches and batch_size were "
                                               "chosen for; at N ranks each cycle then runs n_batches*N/schedule_ranks "
                                               "updates of batch_size*schedule_ranks/N transitions per rank (rounded "
                                               "half up), keeping the updates per env step and the transitions per "
                                               "update of all ranks together; targets moved once per cycle then "
                                               "move once per n_batches updates (null: n_batches and batch_size as "
                                               "written at any rank count, the baselines schedule)")
    n_test_episodes: int = setting(50, "deterministic test episodes per evaluation, all ranks together (split "
                                       "evenly, rounded up; 0: no evaluation)")
    n_test_rollouts: int | None = setting(None, "deprecated: test episodes per rank; use n_test_episodes (null: "
                                                "unset)")
    seed: int = setting(0, "random seed; every (seed, rank) pair gets its own random streams")
    torch_threads: int = setting(1, "PyTorch threads per rank (ranks, not threads, should use the cores)")
    sync_check_every: int = setting(100, "updates between checks that all ranks hold identical parameters (0: "
                                         "only after each epoch)")
    # A policy that has learnt nothing acts almost the same in every state (Fetch: the arm drifts
    # to one side); uniform actions first fill replay with varied outcomes (mrl's initial_explore).
    random_steps: int = setting(0, "off-policy algorithms: uniformly random actions for the first this many env "
                                   "steps (all ranks together); learning runs as usual meanwhile")
    stop_success: float | None = setting(None, "stop after the first evaluation whose test success rate reaches "
                                               "this (null: train every epoch)")
    # Where episodes end at success (bit flipping, discrete Fetch, Ms. Pac-Man) an epoch's env steps
    # shrink as the policy learns: a budget in env steps needs its own bound, n_epochs then a cap.
    max_env_steps: int | None = setting(None, "stop after the first epoch that brings the env steps of all ranks "
                                              "to this many (null: n_epochs alone sets the budget)")

    # A frozen host or a network partition would otherwise hang every other rank in its next
    # collective until the wall-clock limit. Healthy phases between two collectives last seconds
    # (a checkpoint of a full replay buffer, rank 0's video: a minute at most); progress.csv's
    # wait_max_s shows a run's own longest wait.
    hang_timeout_s: float = setting(600.0, "seconds a rank waits on its peers in one collective before the job "
                                           "ends with exit status 5, naming the ranks that did not answer (0: wait "
                                           "forever)")

    def validate(self, path: str) -> None:
        check(self.hang_timeout_s == 0 or self.hang_timeout_s >= 1, f"{path}.hang_timeout_s", self.hang_timeout_s,
              "0 (no timeout) or a number of seconds >= 1")
        for name in ("n_epochs", "n_cycles", "batch_size", "rollouts_per_rank", "torch_threads"):
            check(getattr(self, name) >= 1, f"{path}.{name}", getattr(self, name), "an integer >= 1")
        for name in ("n_batches", "n_test_episodes", "seed", "sync_check_every", "random_steps"):
            check(getattr(self, name) >= 0, f"{path}.{name}", getattr(self, name), "an integer >= 0")
        check(self.max_env_steps is None or self.max_env_steps >= 1, f"{path}.max_env_steps", self.max_env_steps,
              "an integer >= 1 or null")
        check(self.schedule_ranks is None or self.schedule_ranks >= 1, f"{path}.schedule_ranks", self.schedule_ranks,
              "an integer >= 1 or null")
        check(self.stop_success is None or 0.0 < self.stop_success <= 1.0, f"{path}.stop_success",
              self.stop_success, "a success rate in (0, 1] or null")
        check(self.stop_success is None or self.n_test_episodes > 0 or bool(self.n_test_rollouts),
              f"{path}.stop_success", self.stop_success, "null when no test episodes are run (n_test_episodes 0)")
        check(self.n_test_rollouts is None or self.n_test_rollouts >= 0, f"{path}.n_test_rollouts",
              self.n_test_rollouts, "an integer >= 0 or null")
        if self.n_test_rollouts is not None:
            warnings.warn(f"{path}.n_test_rollouts (test episodes per rank) is deprecated; use "
                          f"{path}.n_test_episodes (all ranks together)", FutureWarning, stacklevel=2)

    def update_schedule(self, n_ranks: int) -> tuple[int, int]:
        """(updates per cycle, transitions per update per rank) at ``n_ranks`` ranks: as written, or
        with ``schedule_ranks`` rescaled to it (rounded half up; at least one update if any)."""
        tuned = self.schedule_ranks
        if tuned is None or n_ranks == tuned:
            return self.n_batches, self.batch_size
        batch = (2 * self.batch_size * tuned + n_ranks) // (2 * n_ranks)
        if batch < 1:
            raise ConfigError(f"train.schedule_ranks = {tuned} with train.batch_size = {self.batch_size} leaves "
                              f"less than one transition per update on each of {n_ranks} ranks; expected "
                              f"batch_size >= {math.ceil(n_ranks / (2 * tuned))} or a larger schedule_ranks")
        updates = (2 * self.n_batches * n_ranks + tuned) // (2 * tuned)
        return (max(1, updates) if self.n_batches else 0), batch

    def test_episodes_per_rank(self, n_ranks: int) -> int:
        """Each rank's share of the test episodes (rounded up: every rank runs as many)."""
        if self.n_test_rollouts is not None:  # the deprecated per-rank setting wins if given
            return self.n_test_rollouts
        return -(-self.n_test_episodes // n_ranks)


@dataclass
class ReplayConfig:
    """Off-policy replay (one buffer per rank) and its hindsight relabelling at sample time."""

    size: int = setting(1_000_000, "replay capacity in transitions, per rank")
    strategy: Literal["future", "final", "episode", "random", "none"] = setting(
        "future", "where hindsight goals come from: future (achieved later in the episode), final (at its end), "
                  "episode (anywhere in it), random (any stored episode), none (no relabelling)")
    replay_k: int = setting(4, "hindsight goals per kept goal: a share replay_k / (1 + replay_k + actual_k) of "
                               "each batch is relabelled")
    actual_k: int = setting(0, "mrl's futureactual: a share actual_k / (1 + replay_k + actual_k) of each batch "
                               "gets another stored transition's desired goal (0: none, as baselines)")
    prioritized: bool = setting(False, "prioritized replay (proportional to |TD error|) instead of uniform sampling")
    alpha: float = setting(0.6, "prioritized replay: priority exponent (0: uniform)")
    beta: float = setting(0.4, "prioritized replay: initial importance-weight exponent, annealed linearly to 1")
    beta_anneal_updates: int = setting(0, "prioritized replay: updates until beta reaches 1 (0: the whole run)")
    priority_eps: float = setting(1e-6, "prioritized replay: added to |TD error| so that no priority is 0")
    episode_priority: Literal["none", "energy"] = setting(
        "none", "which episodes batches come from: none (uniform over transitions) or energy (in proportion to the "
                "energy their achieved goal gained, Zhao & Tresp 2018; goals that are 3-D positions)")
    energy_clip: float = setting(0.5, "episode_priority energy: the most energy one transition adds (the paper's "
                                      "Fetch value; unit masses, J)")

    def validate(self, path: str) -> None:
        check(self.size >= 1, f"{path}.size", self.size, "an integer >= 1")
        check(self.replay_k >= 0, f"{path}.replay_k", self.replay_k, "an integer >= 0")
        check(self.actual_k >= 0, f"{path}.actual_k", self.actual_k, "an integer >= 0")
        check(0.0 <= self.alpha <= 1.0, f"{path}.alpha", self.alpha, "a number in [0, 1]")
        check(0.0 <= self.beta <= 1.0, f"{path}.beta", self.beta, "a number in [0, 1]")
        check(self.beta_anneal_updates >= 0, f"{path}.beta_anneal_updates",
               self.beta_anneal_updates, "an integer >= 0")
        check(self.priority_eps > 0, f"{path}.priority_eps", self.priority_eps, "a number > 0")
        check(self.energy_clip > 0, f"{path}.energy_clip", self.energy_clip, "a number > 0")
        check(not (self.prioritized and self.episode_priority != "none"), f"{path}.episode_priority",
              self.episode_priority, "none when replay.prioritized is true (one prioritization at a time)")


@dataclass
class NormalizerConfig:
    """The input path of every network: clip raw inputs, normalise with statistics shared by all
    ranks, clip again."""

    enabled: bool = setting(True, "normalise observations and goals by running mean and std (false: only "
                                  "clip_obs applies)")
    eps: float = setting(0.01, "lower bound of the normalizer's std")
    clip: float = setting(5.0, "normalised inputs are clipped to [-clip, clip]")
    clip_obs: float = setting(200.0, "raw observations and goals are clipped to [-clip_obs, clip_obs] first")

    def validate(self, path: str) -> None:
        for name in ("eps", "clip", "clip_obs"):
            check(getattr(self, name) > 0, f"{path}.{name}", getattr(self, name), "a number > 0")


@dataclass
class CheckpointConfig:
    every: int = setting(5, "also keep checkpoints/epoch_NNNN.pt every N epochs (0: only latest.pt and best.pt)")
    save_buffer: bool = setting(True, "keep each rank's replay buffer with the checkpoints (only the episodes new "
                                      "since the last save are written), so a resume is exact; false: a resumed "
                                      "run starts with empty buffers")

    def validate(self, path: str) -> None:
        check(self.every >= 0, f"{path}.every", self.every, "an integer >= 0")


@dataclass
class LogConfig:
    tensorboard: bool = setting(True, "write TensorBoard events to tb/ (x axis: env steps of all ranks)")
    print_every: int = setting(1, "epochs between progress lines on stdout")
    video_every: int = setting(0, "rank 0 writes videos/epoch_NNNN.<video_format> every N epochs (0: never)")
    video_format: Literal["mp4", "gif"] = setting("mp4", "the video file's format (TensorBoard also gets a GIF)")
    video_episodes: int = setting(2, "deterministic test episodes per video (the same goals every time)")
    video_width: int = setting(256, "video frame width in pixels (even for mp4)")
    video_height: int = setting(256, "video frame height in pixels (even for mp4)")

    def validate(self, path: str) -> None:
        check(self.print_every >= 1, f"{path}.print_every", self.print_every, "an integer >= 1")
        check(self.video_every >= 0, f"{path}.video_every", self.video_every, "an integer >= 0 (0: no videos)")
        check(self.video_episodes >= 1, f"{path}.video_episodes", self.video_episodes, "an integer >= 1")
        for name in ("video_width", "video_height"):
            value = getattr(self, name)
            check(16 <= value <= 4096, f"{path}.{name}", value, "an integer in [16, 4096] (pixels)")
            check(self.video_format != "mp4" or value % 2 == 0, f"{path}.{name}", value,
                  "an even number of pixels for video_format mp4 (H.264)")


# Hidden-layer activations every network builder knows (her_mpi.mlp.ACTIVATIONS).
Activation = Literal["relu", "tanh", "elu"]


def check(ok: bool, path: str, value: Any, expected: str) -> None:
    if not ok:
        raise ConfigError(f"{path}: got {value!r}, expected {expected}")


