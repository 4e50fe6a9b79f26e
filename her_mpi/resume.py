"""Checkpoints of a running trainer, and resuming from them exactly.

Every rank writes its replay segment; rank 0 writes ``latest.pt`` (``best.pt``, periodic ones)
once every rank's files are on disk, and all ranks learn whether everything was written before
any replay file that an older generation used is dropped. A checkpoint holds the agent, the loop
position and every rank's own state (RNG streams, pending normalizer statistics, the epoch in
progress), so a resume on as many ranks continues bit-identically; on another number of ranks it
continues with fresh streams and says what it could not restore.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time

import numpy as np
import torch

from her_mpi import __version__, mpi
from her_mpi.checkpoint import CheckpointWriteError, remove_stale_temporaries, save_checkpoint
from her_mpi.config import ConfigError
from her_mpi.halts import CheckpointFailed, NonFiniteError


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


class ResumableState:
    """The Trainer's checkpoints and resume (a mixin: it reads the trainer's agent, envs and counters)."""

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
