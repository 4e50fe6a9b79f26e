"""The training loop every algorithm runs under.

epochs -> cycles -> (each rank collects ``rollouts_per_rank`` episodes, the agent learns from
them) -> after each epoch: deterministic test rollouts, metrics averaged over ranks, rank 0 logs
and checkpoints. Off-policy agents learn with replay (the baselines schedule), on-policy agents
from the fresh batch; the loop does not care which.

Construction does everything that can fail because of user input (config, env, checkpoint) and
uses no collective; ``run`` starts with the first one. ``her_mpi.train`` lets all ranks agree on
whether construction succeeded everywhere, so a mistake exits every rank cleanly.

Failures and stops end the run on every rank at the same point, without leaving a rank waiting:
ranks agree once per cycle (one small allreduce) on whether any of them was asked to stop
(SIGTERM, SIGINT, SIGUSR1) or saw a non-finite loss or parameter. A stop finishes the cycle,
writes a checkpoint (mid-epoch if need be) and raises :class:`Preempted`; a non-finite value
raises :class:`NonFiniteError` before any checkpoint is written from it; a failed write raises
:class:`CheckpointFailed` on every rank, the previous checkpoint intact.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import math
import random
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

from her_mpi import __version__, mpi, registry
from her_mpi.algos.base import Agent
from her_mpi.checkpoint import (CheckpointWriteError, ReplayStore, check_compatible, remove_stale_temporaries,
                                replay_dir, save_checkpoint)
from her_mpi.config import Config, ConfigError, config_from_dict
from her_mpi.envs import EnvSpec, goal_functions
from her_mpi.logger import RunLogger, progress_line
from her_mpi.optim import NonFiniteValue
from her_mpi.rollout import Episodes, RolloutWorker
from her_mpi.stop_signals import StopSignals
from her_mpi.video import TrainingVideos


class TrainingHalted(Exception):
    """The run stopped on every rank at the same point; ``str()`` says why and what to do."""


class Preempted(TrainingHalted):
    """A stop signal: the checkpoint of the last finished cycle is written; ``--resume`` continues."""


class NonFiniteError(TrainingHalted):
    """A non-finite loss, gradient or parameter; no checkpoint was written from it."""


class CheckpointFailed(TrainingHalted):
    """A checkpoint or replay file could not be written; the previous checkpoint is intact."""


def rank_seeds(seed: int, rank: int, restart: int = 0) -> dict[str, np.random.SeedSequence]:
    """This rank's streams, split by purpose.

    Derived from (seed, rank) jointly: the seed is the entropy and the rank a spawn key, so no
    two (seed, rank) pairs share a stream for any number of ranks (``seed + rank`` would give
    seed 1's rank 0 the streams of seed 0's rank 1). ``restart`` > 0 gives fresh streams for a
    resume on another number of ranks (the saved streams belong to the old layout; starting the
    original ones again would replay the first episodes' goals)."""
    train_envs, test_envs, agent = np.random.SeedSequence(seed, spawn_key=rank_key(rank, restart)).spawn(3)
    return {"train_envs": train_envs, "test_envs": test_envs, "agent": agent}


def rank_key(rank: int, restart: int = 0) -> tuple:
    return (rank,) if restart == 0 else (rank, restart)


def seed_global_generators(seed: int, rank: int, restart: int = 0) -> None:
    """Seed numpy's and Python's global generators from (seed, rank): her_mpi never draws from
    them, but libraries may, and seeded (and checkpointed) they cannot make a run irreproducible.
    The stream is the fourth child of the rank's sequence (rank_seeds takes the first three)."""
    sequence = np.random.SeedSequence(seed, spawn_key=rank_key(rank, restart) + (3,))
    numpy_seed, python_seed = sequence.generate_state(2)
    np.random.seed(int(numpy_seed))
    random.seed(int(python_seed))


def build_agent(config: Config, spec: EnvSpec, env=None, seed_sequence=None) -> Agent:
    """The algorithm named by the config; ``env`` supplies the reward (not needed to act)."""
    cls = registry.algorithm_class(config.algo_name)
    torch.manual_seed(config.train.seed)  # same initial weights everywhere (broadcast anyway)
    goal_fns = goal_functions(env) if env is not None else None
    return cls(spec, config, goal_fns, seed_sequence or np.random.SeedSequence(0))


def agent_from_checkpoint(state: dict) -> Agent:
    """Rebuild the trained agent from a loaded checkpoint (no env needed: acting only)."""
    config = config_from_dict(state["config"])
    agent = build_agent(config, EnvSpec(**state["spec"]))
    agent.load_state_dict(state["agent"])
    return agent


def evaluate(agent: Agent, worker: RolloutWorker, n_episodes: int) -> Episodes:
    return worker.generate(lambda obs, g: agent.act(obs, g, explore=False), n_episodes)


@dataclasses.dataclass
class EpochProgress:
    """A rank's record of the epoch in progress: what its row needs, saved in mid-epoch checkpoints."""

    cycles_done: int = 0
    steps_before: int = 0  # this rank's env steps when the epoch began
    metrics: list = dataclasses.field(default_factory=list)  # one dict of floats per cycle
    train_success: list = dataclasses.field(default_factory=list)
    timing: dict = dataclasses.field(default_factory=lambda: {"time_rollout_s": 0.0, "time_learn_s": 0.0,
                                                               "time_eval_s": 0.0})
    elapsed_s: float = 0.0  # wall time of the epoch before an interruption

    def state(self) -> dict:
        return dataclasses.asdict(self)


def reuse_large_allocations() -> None:
    """Have glibc's malloc keep freed blocks of up to 32 MB for reuse instead of unmapping them.

    A batch of image observations makes tensors of 14-29 MB several times per update, alive
    together and freed together; by default glibc trims a free heap top of more than twice the
    largest such block, so every update faults them in again (four 20 MB tensors: ~20,000 minor
    faults per round, tests/test_speed_paths.py). With the CNN's channels-last copy it took the Ms. Pac-Man DQN learn phase
    (batch 128) from 125-128 to 108-109 ms per update in a quiet epoch (bench/epoch_time.py).
    Small tensors (the MLP recipes) never reach the threshold. No-op where libc is not glibc."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    mallopt(m_mmap_threshold, 32 << 20)  # glibc's largest allowed value
    mallopt(m_trim_threshold, 256 << 20)  # and keep the heap's free top (else it is trimmed away)


def denormals_flushed() -> bool:
    """Whether this thread's floating-point unit flushes subnormal numbers to zero."""
    return float(np.float32(1e-38) / np.float32(1e4)) == 0.0


class Trainer:
    def __init__(self, config: Config, run_dir: Path, resume: dict | None = None):
        self.config, self.run_dir, self.resumed = config, Path(run_dir), resume is not None
        self.rank, self.size = mpi.rank(), mpi.size()
        self.algo = config.algo_name
        torch.set_num_threads(config.train.torch_threads)
        reuse_large_allocations()
        # Tiny Adam moments and gradients otherwise cost 5-10x; restored by close(), since the
        # setting is the thread's (numpy and anything else in the process see it too).
        self.denormals_were_flushed = denormals_flushed()
        torch.set_flush_denormal(True)
        same_layout = resume is None or resume["n_ranks"] == self.size
        restart = 0 if same_layout else int(resume["generation"])
        seeds = rank_seeds(config.train.seed, self.rank, restart)
        seed_global_generators(config.train.seed, self.rank, restart)
        train = config.train
        # Rank 0's policy videos (log.video_every): an env and seed of their own; made before the
        # envs so a missing OpenGL backend fails here, with a message, and MUJOCO_GL is set early.
        self.video = TrainingVideos(config, run_dir) if self.rank == 0 and config.log.video_every else None
        self.worker = RolloutWorker(config.env, train.rollouts_per_rank, seeds["train_envs"])
        self.test_episodes_per_rank = train.test_episodes_per_rank(self.size)
        self.test_worker = RolloutWorker(config.env, max(1, min(self.test_episodes_per_rank, 10)),
                                         seeds["test_envs"])
        self.spec = self.worker.spec
        self.agent = build_agent(config, self.spec, self.worker.envs[0], seeds["agent"])
        self.start_epoch, self.env_steps_per_rank, self.time_offset = 0, 0, 0.0
        # Totals at the resumed checkpoint: a resumed job may have another number of ranks.
        self.resumed_env_steps, self.resumed_env_steps_per_rank = 0, 0
        self.best_success, self.last_test_success = -1.0, float("nan")
        self.generation = 0  # saves so far; names the replay files that belong to a checkpoint
        self.saved_position = (-1, 0)  # (last finished epoch, cycles of the next) of the last save
        self.progress: EpochProgress | None = None  # the interrupted epoch a resume continues
        self.replay_store = ReplayStore(replay_dir(self.checkpoint_dir, self.rank)) \
            if hasattr(self.agent, "buffer") else None
        self.not_restored: list[str] = []
        self.preempted_by: str | None = None
        if resume is not None:
            check_compatible(resume, config.env.id, self.algo)
            self._restore(resume)

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    # -- the loop ------------------------------------------------------------------------------

    def run(self, signals: StopSignals | None = None) -> dict:
        """Train to ``n_epochs``; returns the last epoch's row. Collective from the first line.

        ``signals``: stop requests caught since before training (``her_mpi.train`` catches them from
        its start, so a stop during start-up is not lost); by default caught from here on. Raises :class:`Preempted` after a stop signal (checkpoint written), :class:`NonFiniteError`
        or :class:`CheckpointFailed` (no new checkpoint), identically on every rank."""
        config, train = self.config, self.config.train
        if not self.resumed:
            self.agent.broadcast_parameters()
        self.agent.check_synced()
        self.logger = RunLogger(self.run_dir, config.log.tensorboard, after_epoch=self.start_epoch - 1) \
            if mpi.is_root() else None
        if self.logger is not None and self.not_restored:
            print("her_mpi: resuming on a different number of ranks; not restored: "
                  + "; ".join(self.not_restored), file=sys.stderr, flush=True)
        self.started = time.perf_counter()
        self.epoch_times: list[float] = []
        row: dict = {}
        try:
            with contextlib.nullcontext(signals) if signals is not None else StopSignals() as self.signals:
                # a resume at an epoch's end may already have the budget's env steps (a run extended by epochs)
                resumed_spent = self.progress is None and self.env_budget_spent(self.resumed_env_steps)
                for epoch in range(self.start_epoch, 0 if resumed_spent else train.n_epochs):
                    row = self._run_epoch(epoch)
                    # progress.csv counts epochs from 0, the console (and these stop lines) from 1
                    if self.solved(row) or self.env_budget_spent(row["env_steps"], epoch):
                        break
        finally:
            if self.logger is not None:
                self.logger.close()
            if self.video is not None:
                self.video.close()
        return row

    def solved(self, row: dict) -> bool:
        """Whether the epoch's test success (the same on every rank) reached ``train.stop_success``."""
        goal = self.config.train.stop_success
        if goal is None or not row.get("test_success_rate", 0.0) >= goal - 1e-9:  # k/n rates vs a decimal
            return False
        if mpi.is_root():
            print(f"her_mpi: test success {row['test_success_rate']:.3f} reached train.stop_success = {goal} "
                  f"after epoch {int(row['epoch']) + 1}; stopping", flush=True)
        return True

    def env_budget_spent(self, env_steps: int, epoch: int | None = None) -> bool:
        """Whether ``env_steps`` (all ranks) reached ``train.max_env_steps``."""
        budget = self.config.train.max_env_steps
        if budget is None or env_steps < budget:
            return False
        if mpi.is_root():
            after = f"after epoch {epoch + 1}" if epoch is not None else "at the checkpoint"
            print(f"her_mpi: {int(env_steps):,} env steps reached train.max_env_steps = {budget:,} {after}; "
                  "stopping", flush=True)
        return True

    def close(self) -> None:
        """Close the envs (their simulators and renderers); the trainer cannot collect afterwards."""
        self.worker.close()
        self.test_worker.close()
        torch.set_flush_denormal(self.denormals_were_flushed)

    def _run_epoch(self, epoch: int) -> dict:
        train = self.config.train
        progress = self.progress or EpochProgress(steps_before=self.env_steps_per_rank)
        self.progress = None
        start = time.perf_counter() - progress.elapsed_s
        while progress.cycles_done < train.n_cycles:
            tick = time.perf_counter()
            where = f"epoch {epoch + 1}, cycle {progress.cycles_done + 1}/{train.n_cycles}"
            mpi.set_phase(f"collect ({where})")
            episodes = self.worker.generate(self._behaviour(), train.rollouts_per_rank)
            self.env_steps_per_rank += episodes.n_steps
            progress.train_success.append(float(episodes.success.mean()))
            tock = time.perf_counter()
            mpi.set_phase(f"learn ({where})")
            try:
                metrics = self.agent.learn(episodes)
            except NonFiniteValue as exc:  # the averaged gradient: every rank raises here alike
                name = next((n for n, o in self.agent.optimizers().items() if o is exc.optimizer), "?")
                raise NonFiniteError(self._non_finite_message(f"non-finite {exc.what} in network {name!r}",
                                                              epoch, progress.cycles_done, during=True)) from None
            progress.metrics.append(metrics)
            progress.timing["time_rollout_s"] += tock - tick
            progress.timing["time_learn_s"] += time.perf_counter() - tock
            progress.cycles_done += 1
            if self._agree_after_cycle(epoch, progress.cycles_done - 1, metrics) \
                    and progress.cycles_done < train.n_cycles:
                progress.elapsed_s = time.perf_counter() - start
                self._save(epoch - 1, progress=progress)
                raise Preempted(self._preempted_message(epoch, progress.cycles_done))
        tick = time.perf_counter()
        mpi.set_phase(f"evaluate (epoch {epoch + 1})")
        test = evaluate(self.agent, self.test_worker, self.test_episodes_per_rank) \
            if self.test_episodes_per_rank else None
        progress.timing["time_eval_s"] = time.perf_counter() - tick
        row = self._epoch_row(epoch, progress, test, start)
        self.epoch_times.append(time.perf_counter() - start)
        self.agent.check_synced()
        mpi.set_phase(f"checkpoint (epoch {epoch + 1})")
        self._save(epoch, row=row)
        if self.logger is not None:
            if (epoch + 1) % self.config.log.print_every == 0 or epoch + 1 == train.n_epochs:
                # median: one stalled epoch (a paused job, a slow filesystem) does not inflate the ETA
                epochs_left = train.n_epochs - epoch - 1
                if train.max_env_steps is not None:  # at this run's env steps per epoch so far
                    epochs_left = min(epochs_left, max(train.max_env_steps - row["env_steps"], 0)
                                      * (epoch + 1) / max(row["env_steps"], 1))
                remaining = epochs_left * float(np.median(self.epoch_times[-5:]))
                print(progress_line(row, train.n_epochs, self.epoch_times[-1], remaining), flush=True)
            if self.video is not None and self.video.due(epoch):  # rank 0 only, no collective
                mpi.set_phase(f"video (epoch {epoch + 1})")
                print(self.video.record(self.agent, epoch, row["env_steps"], self.logger.writer), flush=True)
        if self.preempted_by is not None and epoch + 1 < train.n_epochs:
            raise Preempted(self._preempted_message(epoch + 1, 0))
        return row

    def _behaviour(self):
        """The next cycle's policy: uniformly random until this rank's share of train.random_steps
        is collected (a whole cycle at a time), then the agent's exploration policy."""
        collected = self.resumed_env_steps + (self.env_steps_per_rank - self.resumed_env_steps_per_rank) * self.size
        if collected < self.config.train.random_steps:
            return lambda obs, g: self.agent.random_actions(len(obs))
        self.agent.start_episodes(self.config.train.rollouts_per_rank)
        return lambda obs, g: self.agent.act(obs, g, explore=True)

    def _epoch_row(self, epoch: int, progress: EpochProgress, test, start: float) -> dict:
        local = {"train_success_rate": float(np.mean(progress.train_success)) if progress.train_success else float("nan"),
                 **progress.timing,
                 "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # per rank
        if test is not None:  # every rank ran as many test episodes: the mean of means is exact
            local["test_success_rate"] = float(test.success.mean(dtype=np.float64))
            local["test_return"] = float(test.rewards.sum(axis=1).mean())
            local["test_episodes"] = float(len(test) * self.size)
        metrics = [m for m in progress.metrics if m]
        # every key any cycle reported: cycles restored from a checkpoint written by older code
        # may lack a metric the resumed code adds
        for key in dict.fromkeys(key for m in metrics for key in m):
            local[key] = float(np.mean([m[key] for m in metrics if key in m]))
        row = mpi.mean_over_ranks(local)
        row.setdefault("test_success_rate", float("nan"))
        steps = np.array([self.env_steps_per_rank - self.resumed_env_steps_per_rank,
                          self.env_steps_per_rank - progress.steps_before], np.float64)
        new_steps, epoch_steps = mpi.allreduce_sum_(steps)
        # the longest any rank waited on its peers in one collective: the margin to train.hang_timeout_s
        row["wait_max_s"] = mpi.max_over_ranks(mpi.WAITS.take_longest())
        total_steps = self.resumed_env_steps + new_steps
        elapsed = time.perf_counter() - start
        row.update(epoch=epoch, env_steps=int(total_steps), env_steps_per_rank=self.env_steps_per_rank,
                   n_ranks=self.size, time_s=self.time_offset + time.perf_counter() - self.started,
                   steps_per_s=epoch_steps / max(elapsed, 1e-9), updates=self.agent.n_updates)
        return row

    # -- agreement and failures ----------------------------------------------------------------

    def _agree_after_cycle(self, epoch: int, cycle: int, metrics: dict) -> bool:
        """One small allreduce per cycle: did any rank get a stop signal or a non-finite value?
        Returns whether to stop; raises NonFiniteError on every rank if any rank saw one."""
        problem = self._local_non_finite(metrics)
        flags = np.array([self.signals.received is not None, problem is not None], np.float64)
        mpi.allreduce_sum_(flags)
        if flags[1]:
            reports = mpi.allgather_object(problem)
            rank, what = next((r, p) for r, p in enumerate(reports) if p is not None)
            where = f" on rank {rank}" if self.size > 1 else ""
            raise NonFiniteError(self._non_finite_message(what + where, epoch, cycle))
        if flags[0] and self.preempted_by is None:
            names = mpi.allgather_object(self.signals.received)
            self.preempted_by = ", ".join(sorted({f"{n} on rank {r}" for r, n in enumerate(names) if n}))
        return bool(flags[0])

    def _local_non_finite(self, metrics: dict) -> str | None:
        """The first non-finite logged loss (this rank's) or parameter (identical on all ranks)."""
        for key, value in metrics.items():
            if not math.isfinite(value):
                return f"non-finite {key} ({value})"
        for name, tensor in self.agent.nets.state_dict().items():
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() \
                    and not math.isfinite(float(tensor.sum())):
                return f"non-finite parameter {name!r} in network {name.split('.')[0]!r}"
        return None

    def _non_finite_message(self, what: str, epoch: int, cycle: int, during: bool = False) -> str:
        """``during``: found in the update in progress; otherwise after the cycle's last one."""
        agent, train = self.agent, self.config.train
        count, unit = (agent.n_iterations, "iteration") if hasattr(agent, "n_iterations") else (agent.n_updates, "update")
        step = f"{unit} {count + 1}" if during else f"found after {unit} {count}"
        return (f"{what} at epoch {epoch + 1} (cycle {cycle + 1}/{train.n_cycles}), {step}; stopped every "
                f"rank without writing a checkpoint from it ({self.last_checkpoint_text()}). Lower the learning rates, "
                f"check the env's observations and rewards for NaN/Inf, then --resume or start again")

    def last_checkpoint_text(self) -> str:
        if not self.generation:
            return "no checkpoint was written before"
        epoch, cycle = self.saved_position
        after = f"epoch {epoch + 2}, cycle {cycle}" if cycle else f"epoch {epoch + 1}"
        return f"the last good checkpoint, {self.checkpoint_dir / 'latest.pt'} (after {after}), is unchanged"

    def _preempted_message(self, epoch: int, cycle: int) -> str:
        where = f"epoch {epoch + 1}, cycle {cycle}/{self.config.train.n_cycles}" if cycle else f"epoch {epoch + 1}"
        return (f"stopped by {self.preempted_by}: wrote {self.checkpoint_dir / 'latest.pt'} after the last "
                f"finished cycle; continue exactly with --resume {self.run_dir} (from {where})")

    # -- checkpoints ---------------------------------------------------------------------------

    def _save(self, epoch: int, row: dict | None = None, progress: EpochProgress | None = None) -> None:
        """Collective. Every rank writes its replay segment; rank 0 logs the row (first: a resume
        drops rows past its checkpoint) and writes latest (best, periodic) once every rank's files
        are on disk; all ranks then learn whether everything was written, and only then drop
        replay files that older generations used. ``epoch`` is the last finished epoch;
        ``progress`` the epoch in progress (mid-epoch checkpoints after a stop signal)."""
        problem = self._local_non_finite({})
        if problem is not None:  # parameters are identical on every rank: all raise here alike
            cycle = progress.cycles_done if progress is not None else self.config.train.n_cycles
            raise NonFiniteError(self._non_finite_message(problem, epoch + (progress is not None), cycle - 1))
        generation = self.generation + 1
        error, replay_saved = None, False
        if self.replay_store is not None and self.config.checkpoint.save_buffer:
            try:
                self.replay_store.save(self.agent.buffer, generation)
                replay_saved = True
            except CheckpointWriteError as exc:
                error = f"rank {self.rank}: {exc}"
        local = {"rng": self._rng_state(), "pending": self._pending_statistics(), "agent": self._agent_local_state(),
                 "new_env_steps": self.env_steps_per_rank - self.resumed_env_steps_per_rank,
                 "progress": progress.state() if progress is not None else None,
                 "replay_generation": generation if replay_saved else None}
        gathered = mpi.gather_object((local, error))
        outcome = None
        if mpi.is_root():
            errors = [e for _, e in gathered if e]
            if not errors:
                try:
                    self._write_checkpoints(epoch, generation, row, progress, [s for s, _ in gathered])
                except (CheckpointWriteError, OSError) as exc:
                    errors.append(str(exc))
            outcome = errors[0] if errors else None
        outcome = mpi.broadcast_object(outcome)
        if outcome is not None:
            raise CheckpointFailed(f"{outcome}. Stopped every rank; {self.last_checkpoint_text()}. Resume with "
                                   f"--resume {self.run_dir} once the directory can be written")
        self.generation = generation
        self.saved_position = (epoch, progress.cycles_done if progress is not None else 0)
        if replay_saved:
            self.replay_store.commit(generation)

    def _write_checkpoints(self, epoch, generation, row, progress, rank_states) -> None:
        if row is not None:
            self.logger.log(row)
            self.last_test_success = row["test_success_rate"]
        success = self.last_test_success
        is_best = row is not None and np.isfinite(success) and success >= self.best_success
        if is_best:
            self.best_success = success
        if row is not None:
            env_steps, time_s = row["env_steps"], row["time_s"]
        else:  # mid-epoch: the totals so far
            env_steps = self.resumed_env_steps + sum(s["new_env_steps"] for s in rank_states)
            time_s = self.time_offset + time.perf_counter() - self.started
        state = {
            "her_mpi_version": __version__, "algo": self.algo, "config": self.config.to_dict(),
            "spec": dataclasses.asdict(self.spec), "epoch": epoch,
            "cycle": progress.cycles_done if progress is not None else 0,
            "generation": generation, "env_steps": int(env_steps),
            "env_steps_per_rank": self.env_steps_per_rank, "n_ranks": self.size,
            "time_s": time_s, "test_success_rate": success, "best_success": self.best_success,
            "agent": self.agent.state_dict(), "ranks": rank_states,
        }
        save_checkpoint(self.checkpoint_dir / "latest.pt", state)
        if is_best:
            save_checkpoint(self.checkpoint_dir / "best.pt", state)
        every = self.config.checkpoint.every
        if row is not None and every and (epoch + 1) % every == 0:
            save_checkpoint(self.checkpoint_dir / f"epoch_{epoch + 1:04d}.pt", state)

    def _agent_local_state(self) -> dict:
        """The agent's state other than networks and optimizers (identical on every rank): counters
        and values that can differ per rank (e.g. TD3's last actor loss, logged between actor updates)."""
        return {k: v for k, v in self.agent.state_dict().items() if k not in ("nets", "optimizers")}

    def _pending_statistics(self) -> dict:
        """Normalizer statistics observed on this rank but not yet merged (zero between cycles)."""
        return {name: module.pending.copy() for name, module in self.agent.nets.named_modules()
                if isinstance(getattr(module, "pending", None), np.ndarray)}

    def _rng_state(self) -> dict:
        def env_state(env) -> dict:
            return {"np_random": env.unwrapped.np_random.bit_generator.state,
                    "action_space": env.action_space.np_random.bit_generator.state}

        numpy_global = np.random.get_state(legacy=False)
        numpy_global["state"] = {"key": numpy_global["state"]["key"].tolist(), "pos": numpy_global["state"]["pos"]}
        return {"agent": self.agent.rng_state(),
                "train_envs": [env_state(env) for env in self.worker.envs],
                "test_envs": [env_state(env) for env in self.test_worker.envs],
                "torch_global": torch.get_rng_state(), "numpy_global": numpy_global,
                "python": random.getstate()}

    def _set_rng_state(self, rng: dict) -> None:
        self.agent.set_rng_state(rng["agent"])
        for envs, states in ((self.worker.envs, rng["train_envs"]), (self.test_worker.envs, rng["test_envs"])):
            if len(envs) != len(states):
                raise ConfigError(f"the checkpoint has RNG states for {len(states)} envs per rank, this config "
                                  f"builds {len(envs)} (train.rollouts_per_rank or test episodes changed?)")
            for env, state in zip(envs, states):
                env.unwrapped.np_random.bit_generator.state = state["np_random"]
                env.action_space.np_random.bit_generator.state = state["action_space"]
        torch.set_rng_state(rng["torch_global"])
        numpy_global = dict(rng["numpy_global"])
        numpy_global["state"] = {"key": np.array(numpy_global["state"]["key"], np.uint32),
                                 "pos": numpy_global["state"]["pos"]}
        np.random.set_state(numpy_global)
        random.setstate(rng["python"])

    def _restore(self, state: dict) -> None:
        same_layout = state["n_ranks"] == self.size
        mine = state["ranks"][self.rank] if self.rank < len(state["ranks"]) else None
        agent_state = {**state["agent"], **mine["agent"]} if same_layout else state["agent"]
        try:
            self.agent.load_state_dict(agent_state)
        except (RuntimeError, KeyError, ValueError, TypeError) as exc:  # e.g. --set algo.hidden=... on resume
            raise ConfigError(f"checkpoint {state['path']} does not fit the networks this config "
                              f"builds (changed sizes or env dims?): {exc}") from None
        self.start_epoch = state["epoch"] + 1
        self.env_steps_per_rank = self.resumed_env_steps_per_rank = state["env_steps_per_rank"]
        self.resumed_env_steps = int(state["env_steps"])
        self.time_offset = state["time_s"]
        self.best_success = state["best_success"]
        self.last_test_success = state["test_success_rate"]
        self.generation = int(state["generation"])
        self.saved_position = (state["epoch"], state["cycle"])
        if same_layout:  # every rank continues its own streams and its epoch in progress
            self._set_rng_state(mine["rng"])
            for name, module in self.agent.nets.named_modules():
                if name in mine["pending"]:
                    module.pending[:] = np.asarray(mine["pending"][name])
            if mine["progress"] is not None:
                self.progress = EpochProgress(**mine["progress"])
        else:
            self.not_restored = [
                f"each rank's random streams (the {state['n_ranks']} saved ones belong to the old layout; "
                f"every rank starts fresh streams)",
                f"the replay buffers of old ranks {self.size}..{state['n_ranks'] - 1} (rank r keeps old rank r's "
                f"buffer)" if state["n_ranks"] > self.size else
                f"replay buffers for new ranks {state['n_ranks']}..{self.size - 1} (they start empty; rank r "
                f"keeps old rank r's buffer)"]
            if state["cycle"]:
                self.progress = EpochProgress(cycles_done=state["cycle"], steps_before=self.env_steps_per_rank)
                self.not_restored.append(
                    f"the metrics of the first {state['cycle']} cycles of epoch {state['epoch'] + 2} (its "
                    f"progress row averages the cycles run after this resume)")
        if mpi.is_root():  # debris of writes that a killed job left unfinished
            remove_stale_temporaries(self.checkpoint_dir)
            remove_stale_temporaries(self.run_dir)
        self._restore_replay(state, mine)

    def _restore_replay(self, state: dict, mine: dict | None) -> None:
        if self.replay_store is None:
            return
        generation = mine.get("replay_generation") if mine is not None else None
        if generation is None or not self.replay_store.has(generation):
            if mine is not None or state["n_ranks"] > self.rank:
                print(f"her_mpi: rank {self.rank}: no replay files of checkpoint generation {state['generation']} in "
                      f"{self.replay_store.directory} (checkpoint.save_buffer was off, or they were removed); "
                      f"starting with an empty replay buffer, so this resume is not exact",
                      file=sys.stderr, flush=True)
            return
        try:
            self.replay_store.load(self.agent.buffer, generation)
        except ValueError as exc:  # e.g. --set replay.size=... on resume (ConfigError is a ValueError)
            raise ConfigError(f"{self.replay_store.directory}: {exc}") from None
