"""The training loop every algorithm runs under.

epochs -> cycles -> (each rank collects ``rollouts_per_rank`` episodes, the agent learns from
them) -> after each epoch: deterministic test rollouts, metrics averaged over ranks, rank 0 logs
and checkpoints. Off-policy agents learn with replay (the baselines schedule), on-policy agents
from the fresh batch; the loop does not care which.

Construction does everything that can fail because of user input (config, env, checkpoint) and
uses no collective; ``run`` starts with the first one. ``her_mpi.train`` lets all ranks agree on
whether construction succeeded everywhere, so a mistake exits every rank cleanly.
"""

from __future__ import annotations

import dataclasses
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

from her_mpi import __version__, mpi
from her_mpi.algos import ALGORITHMS
from her_mpi.algos.base import Agent
from her_mpi.checkpoint import (check_compatible, load_replay, replay_path, save_checkpoint,
                                save_replay)
from her_mpi.config import Config, ConfigError, config_from_dict
from her_mpi.envs import EnvSpec, goal_functions
from her_mpi.logger import RunLogger, progress_line
from her_mpi.rollout import Episodes, RolloutWorker
from her_mpi.video import TrainingVideos


def rank_seeds(seed: int, rank: int) -> dict[str, np.random.SeedSequence]:
    """This rank's streams, split by purpose.

    Derived from (seed, rank) jointly: the seed is the entropy and the rank a spawn key, so no
    two (seed, rank) pairs share a stream for any number of ranks (``seed + rank`` would give
    seed 1's rank 0 the streams of seed 0's rank 1)."""
    train_envs, test_envs, agent = np.random.SeedSequence(seed, spawn_key=(rank,)).spawn(3)
    return {"train_envs": train_envs, "test_envs": test_envs, "agent": agent}


def build_agent(config: Config, spec: EnvSpec, env=None, seed_sequence=None) -> Agent:
    """The algorithm named by the config; ``env`` supplies the reward (not needed to act)."""
    cls = ALGORITHMS[config.algo_name]
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


class Trainer:
    def __init__(self, config: Config, run_dir: Path, resume: dict | None = None):
        self.config, self.run_dir, self.resumed = config, Path(run_dir), resume is not None
        self.rank, self.size = mpi.rank(), mpi.size()
        self.algo = config.algo_name
        torch.set_num_threads(config.train.torch_threads)
        torch.set_flush_denormal(True)  # tiny Adam moments and gradients otherwise cost 5-10x
        seeds = rank_seeds(config.train.seed, self.rank)
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
        self.best_success = -1.0
        if resume is not None:
            check_compatible(resume, config.env.id, self.algo)
            self._restore(resume)

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> dict:
        """Train to ``n_epochs``; returns the last epoch's row. Collective from the first line."""
        config, train = self.config, self.config.train
        if not self.resumed:
            self.agent.broadcast_parameters()
        self.agent.check_synced()
        self.logger = RunLogger(self.run_dir, config.log.tensorboard, after_epoch=self.start_epoch - 1) \
            if mpi.is_root() else None
        self.started = time.perf_counter()
        row: dict = {}
        epoch_times: list[float] = []
        for epoch in range(self.start_epoch, train.n_epochs):
            start = time.perf_counter()
            steps_before = self.env_steps_per_rank
            metrics, train_success = [], []
            timing = {"time_rollout_s": 0.0, "time_learn_s": 0.0, "time_eval_s": 0.0}
            for _ in range(train.n_cycles):
                tick = time.perf_counter()
                episodes = self.worker.generate(lambda o, g: self.agent.act(o, g, explore=True),
                                                train.rollouts_per_rank)
                self.env_steps_per_rank += episodes.n_steps
                train_success.append(float(episodes.success.mean()))
                tock = time.perf_counter()
                metrics.append(self.agent.learn(episodes))
                timing["time_rollout_s"] += tock - tick
                timing["time_learn_s"] += time.perf_counter() - tock
            tick = time.perf_counter()
            test = evaluate(self.agent, self.test_worker, self.test_episodes_per_rank) \
                if self.test_episodes_per_rank else None
            timing["time_eval_s"] = time.perf_counter() - tick
            row = self._epoch_row(epoch, metrics, train_success, test, start, steps_before, timing)
            epoch_times.append(time.perf_counter() - start)
            self.agent.check_synced()
            if self.logger is not None:  # the row first: a resume drops rows past its checkpoint
                self.logger.log(row)
            self._save(epoch, row)
            if self.logger is not None:
                if (epoch + 1) % config.log.print_every == 0 or epoch + 1 == train.n_epochs:
                    remaining = (train.n_epochs - epoch - 1) * float(np.mean(epoch_times[-5:]))
                    print(progress_line(row, train.n_epochs, epoch_times[-1], remaining), flush=True)
            if self.video is not None and self.video.due(epoch):  # rank 0 only, no collective
                print(self.video.record(self.agent, epoch, row["env_steps"], self.logger.writer), flush=True)
        if self.logger is not None:
            self.logger.close()
        if self.video is not None:
            self.video.close()
        return row

    def _epoch_row(self, epoch, metrics, train_success, test, start, steps_before, timing) -> dict:
        local = {"train_success_rate": float(np.mean(train_success)), **timing,
                 "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # per rank
        if test is not None:  # every rank ran as many test episodes: the mean of means is exact
            local["test_success_rate"] = float(test.success.mean())
            local["test_return"] = float(test.rewards.sum(axis=1).mean())
            local["test_episodes"] = float(len(test) * self.size)
        for key in metrics[0] if metrics and metrics[0] else ():
            local[key] = float(np.mean([m[key] for m in metrics]))
        row = mpi.mean_over_ranks(local)
        row.setdefault("test_success_rate", float("nan"))
        steps = np.array([self.env_steps_per_rank - self.resumed_env_steps_per_rank,
                          self.env_steps_per_rank - steps_before], np.float64)
        new_steps, epoch_steps = mpi.allreduce_sum_(steps)
        total_steps = self.resumed_env_steps + new_steps
        elapsed = time.perf_counter() - start
        row.update(epoch=epoch, env_steps=int(total_steps), env_steps_per_rank=self.env_steps_per_rank,
                   n_ranks=self.size, time_s=self.time_offset + time.perf_counter() - self.started,
                   steps_per_s=epoch_steps / max(elapsed, 1e-9), updates=self.agent.n_updates)
        return row

    # -- checkpoints ---------------------------------------------------------------------------

    def _save(self, epoch: int, row: dict) -> None:
        """Collective (RNG states are gathered); rank 0 writes latest, best and periodic files."""
        rng_states = mpi.gather_object(self._rng_state())
        checkpoint_dir = self.run_dir / "checkpoints"
        if self.config.checkpoint.save_buffer and hasattr(self.agent, "buffer_state"):
            save_replay(replay_path(checkpoint_dir, self.rank), {**self.agent.buffer_state(), "epoch": epoch})
        if not mpi.is_root():
            return
        success = row["test_success_rate"]
        is_best = np.isfinite(success) and success >= self.best_success
        if is_best:
            self.best_success = success
        state = {
            "her_mpi_version": __version__, "algo": self.algo, "config": self.config.to_dict(),
            "spec": dataclasses.asdict(self.spec), "epoch": epoch, "env_steps": row["env_steps"],
            "env_steps_per_rank": self.env_steps_per_rank, "n_ranks": self.size,
            "time_s": row["time_s"], "test_success_rate": success, "best_success": self.best_success,
            "agent": self.agent.state_dict(), "rng": rng_states,
        }
        save_checkpoint(checkpoint_dir / "latest.pt", state)
        if is_best:
            save_checkpoint(checkpoint_dir / "best.pt", state)
        every = self.config.checkpoint.every
        if every and (epoch + 1) % every == 0:
            save_checkpoint(checkpoint_dir / f"epoch_{epoch + 1:04d}.pt", state)

    def _rng_state(self) -> dict:
        return {"agent": self.agent.rng_state(),
                "train_envs": [env.unwrapped.np_random.bit_generator.state for env in self.worker.envs],
                "test_envs": [env.unwrapped.np_random.bit_generator.state for env in self.test_worker.envs]}

    def _restore(self, state: dict) -> None:
        try:
            self.agent.load_state_dict(state["agent"])
        except (RuntimeError, KeyError, ValueError) as exc:  # e.g. --set algo.hidden=... on resume
            raise ConfigError(f"checkpoint {state['path']} does not fit the networks this config "
                              f"builds (changed sizes or env dims?): {exc}") from None
        self.start_epoch = state["epoch"] + 1
        self.env_steps_per_rank = self.resumed_env_steps_per_rank = state["env_steps_per_rank"]
        self.resumed_env_steps = int(state["env_steps"])
        self.time_offset = state["time_s"]
        self.best_success = state["best_success"]
        if state["n_ranks"] == self.size:  # same layout: every rank continues its own streams
            rng = state["rng"][self.rank]
            self.agent.set_rng_state(rng["agent"])
            for env, env_state in zip(self.worker.envs, rng["train_envs"]):
                env.unwrapped.np_random.bit_generator.state = env_state
            for env, env_state in zip(self.test_worker.envs, rng["test_envs"]):
                env.unwrapped.np_random.bit_generator.state = env_state
            path = replay_path(Path(state["path"]).parent, self.rank)
            if self.config.checkpoint.save_buffer and path.is_file() and hasattr(self.agent, "load_buffer_state"):
                replay = load_replay(path)
                # A replay file from another epoch (a kill between the ranks' writes, or an older
                # run) would pair the networks with the wrong data: start with an empty buffer.
                if replay.pop("epoch", None) == state["epoch"]:
                    try:
                        self.agent.load_buffer_state(replay)
                    except ValueError as exc:  # e.g. --set replay.size=... on resume
                        raise ConfigError(f"{path}: {exc}") from None
                else:
                    print(f"her_mpi: rank {self.rank}: {path} is not from epoch {state['epoch']}; "
                          "starting with an empty replay buffer", file=sys.stderr, flush=True)
