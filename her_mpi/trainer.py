"""The training loop every algorithm runs under.

epochs -> cycles -> (each rank collects ``rollouts_per_rank`` episodes, the agent learns from
them) -> after each epoch: deterministic test rollouts, metrics averaged over ranks, rank 0 logs
and checkpoints. Off-policy agents learn with replay (the baselines schedule), on-policy agents
from the fresh batch; the loop does not care which.

Construction does everything that can fail because of user input (config, env, checkpoint) and
uses no collective; ``run`` starts with the first one. ``her_mpi.train`` lets all ranks agree on
whether construction succeeded everywhere, so a mistake exits every rank cleanly.

Failures and stops end the run on every rank at the same point (:mod:`her_mpi.halts`);
checkpoints and exact resumes are :mod:`her_mpi.resume`'s; the malloc and floating-point settings
that make updates cost their arithmetic are :mod:`her_mpi.process_tuning`'s.
"""

from __future__ import annotations

import contextlib
import random
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

from her_mpi import mpi, registry
from her_mpi.algos.base import Agent
from her_mpi.checkpoint import ReplayStore, check_compatible, replay_dir
from her_mpi.config import Config, config_from_dict
from her_mpi.envs import EnvSpec, goal_functions
from her_mpi.logger import RunLogger, progress_line, read_progress
from her_mpi.optim import NonFiniteValue
from her_mpi.rollout import Episodes, RolloutWorker
from her_mpi.halts import CheckpointFailed, HaltAgreement, NonFiniteError, Preempted, TrainingHalted  # noqa: F401
from her_mpi.process_tuning import denormals_flushed, reuse_large_allocations
from her_mpi.resume import EpochProgress, ResumableState
from her_mpi.stop_signals import StopSignals
from her_mpi.video import TrainingVideos

# above this share of test steps with an input past the normaliser's clip, in this many epochs in a
# row (the first epochs' statistics come from a few random steps), rank 0 says so, once a run
CLIPPED_INPUTS_WARNING, CLIPPED_INPUTS_EPOCHS = 0.05, 3


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


class Trainer(HaltAgreement, ResumableState):
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
        self.clipped_inputs_epochs = 0  # epochs in a row above CLIPPED_INPUTS_WARNING; -1 once warned
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
        self.preempted_signals: list[str] = []
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
        its start, so a stop during start-up is not lost); by default caught from here on. Raises
        :class:`Preempted` after a stop signal (checkpoint written), :class:`NonFiniteError` or
        :class:`CheckpointFailed` (no new checkpoint), identically on every rank."""
        config, train = self.config, self.config.train
        if not self.resumed:
            self.agent.broadcast_parameters()
        self.agent.check_synced()
        self.logger = RunLogger(self.run_dir, config.log.tensorboard, after_epoch=self.start_epoch - 1) \
            if mpi.is_root() else None
        if self.logger is not None and train.schedule_ranks not in (None, self.size):
            print(f"her_mpi: train.schedule_ranks = {train.schedule_ranks}: at {self.size} ranks each cycle runs "
                  f"{self.agent.n_batches} updates of {self.agent.batch_size} transitions per rank (recipe: "
                  f"{train.n_batches} of {train.batch_size})", flush=True)
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
                if self.resumed and not resumed_spent and self.start_epoch >= train.n_epochs and mpi.is_root():
                    print(f"her_mpi: the run has {self.start_epoch} epochs done and train.n_epochs = {train.n_epochs}: "
                          f"nothing to train (a larger train.n_epochs trains on)", flush=True)
                for epoch in range(self.start_epoch, 0 if resumed_spent else train.n_epochs):
                    row = self._run_epoch(epoch)
                    # progress.csv counts epochs from 0, the console (and these stop lines) from 1
                    if self.solved(row) or self.env_budget_spent(row["env_steps"], epoch):
                        break
                if not row and self.resumed:  # no epoch to run: the run stands at its last finished epoch
                    row = self.last_finished_row()
        finally:
            if self.logger is not None:
                self.logger.close()
            if self.video is not None:
                self.video.close()
        return row

    def last_finished_row(self) -> dict:
        """The last epoch's row as progress.csv has it (a mid-epoch checkpoint's step count includes steps
        of the unfinished epoch), else as the checkpoint says."""
        rows = [r for r in read_progress(self.run_dir) if int(r["epoch"]) < self.start_epoch]
        if not rows:
            return {"epoch": self.start_epoch - 1, "env_steps": self.resumed_env_steps,
                    "test_success_rate": self.last_test_success}
        last = rows[-1]
        success = last.get("test_success_rate")
        return {"epoch": int(last["epoch"]), "env_steps": int(float(last["env_steps"])),
                "test_success_rate": float(success) if success else None}

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
                raise self._preempted(epoch, progress.cycles_done)
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
                print(progress_line(row, train.n_epochs, self.epoch_times[-1], remaining, train.max_env_steps), flush=True)
            if self.video is not None and self.video.due(epoch):  # rank 0 only, no collective
                mpi.set_phase(f"video (epoch {epoch + 1})")
                print(self.video.record(self.agent, epoch, row["env_steps"], self.logger.writer), flush=True)
        if self.preempted_by is not None and epoch + 1 < train.n_epochs:
            raise self._preempted(epoch + 1, 0)
        return row

    def _behaviour(self):
        """The next cycle's policy: uniformly random until this rank's share of train.random_steps
        is collected (a whole cycle at a time), then the agent's exploration policy."""
        collected = self.resumed_env_steps + (self.env_steps_per_rank - self.resumed_env_steps_per_rank) * self.size
        if collected < self.config.train.random_steps:
            return lambda obs, g: self.agent.random_actions(len(obs))
        self.agent.start_episodes(self.config.train.rollouts_per_rank)
        return lambda obs, g: self.agent.act(obs, g, explore=True)

    def _inputs_beyond_clip(self, test: Episodes, epoch: int) -> float | None:
        """The share of the test steps with an input beyond the normaliser's clip; rank 0 says once
        when it stays large, naming the input most often cut."""
        beyond_clip = getattr(self.agent.inputs, "beyond_clip", None)  # image inputs are not normalised
        if beyond_clip is None:
            return None
        taken = np.arange(test.obs.shape[1] - 1) < test.lengths[:, None]
        clipped = beyond_clip(test.obs[:, :-1][taken], test.g[:, :-1][taken])
        share = float(clipped.any(axis=1).mean())
        if self.clipped_inputs_epochs >= 0:
            self.clipped_inputs_epochs = self.clipped_inputs_epochs + 1 if share > CLIPPED_INPUTS_WARNING else 0
        if self.clipped_inputs_epochs == CLIPPED_INPUTS_EPOCHS and self.rank == 0:
            self.clipped_inputs_epochs = -1
            worst = int(clipped.mean(axis=0).argmax())
            obs_dim = test.obs.shape[-1]
            name = f"observation[{worst}]" if worst < obs_dim else f"desired_goal[{worst - obs_dim}]"
            print(f"her_mpi: an input lies beyond normalizer.clip={self.config.normalizer.clip:g} std of its "
                  f"running statistics in over {CLIPPED_INPUTS_WARNING:.0%} of the test steps for "
                  f"{CLIPPED_INPUTS_EPOCHS} epochs ({share:.0%} in epoch {epoch + 1}), most often {name} "
                  f"({clipped[:, worst].mean():.0%} of steps); the networks see one value for all of them. If the "
                  "task needs those values (an object lifted high), raise normalizer.clip.", flush=True)
        return share

    def _epoch_row(self, epoch: int, progress: EpochProgress, test, start: float) -> dict:
        local = {"train_success_rate": float(np.mean(progress.train_success)) if progress.train_success else float("nan"),
                 **progress.timing,
                 "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # per rank
        if test is not None:  # every rank ran as many test episodes: the mean of means is exact
            local["test_success_rate"] = float(test.success.mean(dtype=np.float64))
            local["test_return"] = float(test.rewards.sum(axis=1).mean())
            local["test_episodes"] = float(len(test) * self.size)
            clipped = self._inputs_beyond_clip(test, epoch)
            if clipped is not None:
                local["inputs_clipped"] = clipped
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
