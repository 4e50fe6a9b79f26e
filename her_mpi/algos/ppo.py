"""PPO-HER: PPO whose fresh rollouts are also replayed for hindsight goals (the paper *Hindsight
Experience Replay Accelerates Proximal Policy Optimization*).

After each batch of episodes, every episode is copied with a goal it achieved (``final``: its
last achieved goal; ``future``: the achieved goal after a uniformly random step; ``episode``:
the same but the start state's counts too), each copy ending at its first success with rewards
recomputed by the env's own reward function (plus the time-out reward where time ran out).
With ``shift_goals`` a copy's goal is not that achieved goal held still but the episode's goal
trajectory translated to pass through it at its step: for a moving goal (predator-prey's prey) the
copy's goal then moves as the velocity in the observation says; for a goal that stands still the
two are the same. ``clip_shifted_goals`` clips that trajectory to the goal space's bounds, as the
env clips its prey to the arena (a translated trajectory can leave the arena on other steps).
Values and log-probabilities are recomputed with the current policy for every copy with the
actions kept (so the ratio starts at 1; no importance correction, as in the paper), advantages
are GAE, and the usual clipped PPO update runs on originals and copies together.
``hindsight: false`` is plain PPO.

Under MPI every rank uses the same number of minibatches per epoch (from the global row
count), gradients are averaged, and the target-KL early stop is decided on the global mean.

The ratio's reference is the collecting policy: log-probabilities and values are computed with
the normalizer statistics the batch was collected with, which take in the batch only after the
update. The target-KL stop is checked on each minibatch before its step (Stable-Baselines3's
order), so no step is taken once the policy has moved too far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from her_mpi import mpi
from her_mpi.algos.on_policy import OnPolicyAgent, OnPolicyParams, Relabelled, gae, global_sum, relabel
from her_mpi.settings import ConfigError, Unused, check, setting
from her_mpi.optim import SyncedAdam
from her_mpi.rollout import Episodes


@dataclass
class PPOParams(OnPolicyParams):
    RENAMED = {"lr": "lr_actor"}

    gamma: float = 0.99
    gae_lambda: float = setting(0.95, "GAE lambda of the advantages")
    lr_actor: float = setting(3e-4, "Adam learning rate of the policy")
    lr_critic: float = 3e-4
    n_epochs: int = setting(10, "passes over each batch of episodes")
    minibatch_size: int = setting(64, "rows per minibatch, per rank")
    clip_range: float = setting(0.2, "PPO's clip of the probability ratio to [1 - clip_range, 1 + clip_range]")
    target_kl: float = setting(0.05, "stop before a minibatch step once its mean KL exceeds 1.5x this (0: never)")
    entropy_coef: float = setting(0.0, "weight of the entropy bonus in the policy loss")
    max_grad_norm: float = setting(0.5, "gradients of policy and value network are clipped to this global norm")
    strategy: Literal["final", "future", "episode"] = setting(
        "final", "hindsight goal of each copy: final (the episode's last achieved goal), future (after a random step) "
                 "or episode (at a random step)")
    replay_k: int = setting(1, "hindsight copies per episode (future, episode; final makes exactly one)")
    shift_goals: bool = setting(
        False, "a copy's goal is the episode's goal trajectory translated to pass through the chosen achieved goal "
               "at its step (keeps a moving goal's motion; the same as holding that achieved goal for a static goal)")
    clip_shifted_goals: bool = setting(
        False, "clip shifted goal trajectories to the env's goal-space bounds (predator-prey: the arena, where "
               "the env clips its prey)")

    def validate(self, path: str) -> None:
        super().validate(path)
        check(0.0 <= self.gae_lambda <= 1.0, f"{path}.gae_lambda", self.gae_lambda, "a number in [0, 1]")
        check(self.lr_actor > 0, f"{path}.lr_actor", self.lr_actor, "a number > 0")
        for name in ("n_epochs", "minibatch_size", "replay_k"):
            check(getattr(self, name) >= 1, f"{path}.{name}", getattr(self, name), "an integer >= 1")
        for name in ("clip_range", "target_kl", "entropy_coef", "max_grad_norm"):
            check(getattr(self, name) >= 0, f"{path}.{name}", getattr(self, name), "a number >= 0")
        # final has one goal per episode: more copies would be identical
        check(self.strategy != "final" or self.replay_k == 1, f"{path}.replay_k", self.replay_k,
              f"1 with {path}.strategy final (one final goal per episode; future or episode draw replay_k goals)")

    SCHEDULE = ("it learns once per cycle: algo.n_epochs passes over the cycle's episodes in minibatches of "
                "algo.minibatch_size rows")
    BATCH = "its minibatches have algo.minibatch_size rows (per rank)"

    def unused_keys(self, config) -> dict[str, Unused]:
        unused = super().unused_keys(config)
        if not self.hindsight:  # plain PPO, often an ablation of a PPO-HER recipe: warned, not refused
            for name in ("strategy", "replay_k", "shift_goals", "clip_shifted_goals"):
                unused[f"algo.{name}"] = Unused("it makes hindsight copies, and algo.hindsight is false", refuse=False)
        elif not self.shift_goals:
            unused["algo.clip_shifted_goals"] = Unused("it clips shifted goals, and algo.shift_goals is false")
        return unused


class PPO(OnPolicyAgent):
    name = "ppo"
    Params = PPOParams

    def __init__(self, spec, config, goal_fns, seed_sequence):
        super().__init__(spec, config, goal_fns, seed_sequence)
        self.policy_optimizer = SyncedAdam(self.policy_net, self.params.lr_actor, self.params.max_grad_norm)
        self.value_optimizer.max_grad_norm = self.params.max_grad_norm
        if self.params.clip_shifted_goals and self.params.shift_goals and not spec.goal_low:
            raise ConfigError(f"algo.clip_shifted_goals = true on {spec.env_id}: its goal space has no finite "
                              f"bounds to clip to; expected false for this env")

    def optimizers(self) -> dict:
        return {**super().optimizers(), "policy": self.policy_optimizer}

    def hindsight_goals(self, episodes: Episodes) -> tuple[np.ndarray, np.ndarray]:
        """(source episode, goal sequence [copies, T+1, goal_dim]) of each hindsight copy."""
        p, n, T = self.params, len(episodes), episodes.actions.shape[1]
        lengths = episodes.lengths
        if p.strategy == "final":
            source, index = np.arange(n), lengths
        else:
            source = np.repeat(np.arange(n), p.replay_k)
            first = 1 if p.strategy == "future" else 0
            index = first + (self.rng.random(len(source)) * (lengths[source] + 1 - first)).astype(np.int64)
        achieved = episodes.ag[source, index]
        if p.shift_goals:
            shifted = episodes.g[source] + (achieved - episodes.g[source, index])[:, None, :]
            if p.clip_shifted_goals:  # the achieved goal is inside, so the copy still passes through it
                shifted = np.clip(shifted, np.asarray(self.spec.goal_low, np.float32),
                                  np.asarray(self.spec.goal_high, np.float32))
            return source, shifted
        return source, np.repeat(achieved[:, None, :], T + 1, axis=1)

    def rewards(self, episodes: Episodes, data: Relabelled) -> np.ndarray:
        copy, t = data.rows
        rewards = self.goal_fns.reward(episodes.ag[data.source[copy], t + 1], data.goals[copy, t + 1])
        timed_out = (data.length == episodes.actions.shape[1]) & ~data.terminal.any(axis=1)
        last = t == data.length[copy] - 1
        return (rewards + np.where(timed_out[copy] & last, self.goal_fns.timeout_reward, 0.0)).astype(np.float32)

    def learn(self, episodes: Episodes) -> dict[str, float]:
        p, n = self.params, len(episodes)
        source, goals = np.arange(n), episodes.g
        if p.hindsight:
            extra_source, extra_goals = self.hindsight_goals(episodes)
            source = np.concatenate([source, extra_source])
            goals = np.concatenate([goals, extra_goals])
        data = relabel(episodes, source, goals, self.goal_fns.success)
        batch = self.row_tensors(episodes, data)
        with torch.no_grad():  # log-probs and values of the kept actions under each copy's goal
            batch["old_log_prob"] = self.policy_net.log_prob(batch["x"], batch["actions"])
            value = self.value_net(batch["x"]).squeeze(-1)
            next_value = self.value_net(batch["x_next"]).squeeze(-1)
        advantages = gae(data, self.rewards(episodes, data), value.numpy(), next_value.numpy(), p.gamma, p.gae_lambda)
        batch["advantages"] = torch.from_numpy(advantages)
        batch["returns"] = batch["advantages"] + value
        del batch["x_next"]
        metrics = self.optimize(batch)
        metrics.update(rows=float(global_sum(len(batch["x"]))[0]), relabelled_copies=float(len(source) - n))
        self.update_normalizers(episodes)  # only now: this batch's reference is the collecting policy
        self.n_iterations += 1
        return metrics

    def optimize(self, batch) -> dict[str, float]:
        p = self.params
        n_rows = len(batch["x"])
        n_minibatches = max(1, math.ceil(global_sum(n_rows)[0] / (mpi.size() * p.minibatch_size)))
        losses, kls, clipped, stopped_epoch = [], [], [], p.n_epochs
        for epoch in range(p.n_epochs):
            order = torch.randperm(n_rows, generator=self.torch_rng)
            for rows in torch.tensor_split(order, n_minibatches):
                mb = {k: batch[k][rows] for k in ("x", "actions", "old_log_prob", "advantages", "returns")}
                advantages = mb["advantages"]
                if len(rows) > 1:
                    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
                log_prob = self.policy_net.log_prob(mb["x"], mb["actions"])
                ratio = (log_prob - mb["old_log_prob"]).exp()
                with torch.no_grad():  # how far the policy has moved on this minibatch, before stepping
                    log_ratio = log_prob.detach() - mb["old_log_prob"]
                    kl_sum, count = global_sum(float(((log_ratio.exp() - 1) - log_ratio).sum()), len(rows))
                kls.append(kl_sum / max(count, 1))
                if p.target_kl and kls[-1] > 1.5 * p.target_kl:
                    break
                policy_loss = -torch.min(ratio * advantages,
                                         ratio.clamp(1 - p.clip_range, 1 + p.clip_range) * advantages).mean()
                entropy = self.policy_net.entropy(mb["x"]).mean() if len(rows) else torch.zeros(())
                loss = torch.nan_to_num(policy_loss - p.entropy_coef * entropy)  # empty minibatch: 0
                self.policy_optimizer.minimize(loss + 0.0 * sum(q.sum() for q in self.policy_net.parameters()))
                value_loss = torch.nan_to_num((self.value_net(mb["x"]).squeeze(-1) - mb["returns"]).pow(2).mean())
                self.value_optimizer.minimize(value_loss + 0.0 * sum(q.sum() for q in self.value_net.parameters()))
                clip_sum = global_sum(float(((ratio.detach() - 1).abs() > p.clip_range).float().sum()))[0]
                clipped.append(clip_sum / max(count, 1))
                losses.append((float(policy_loss.detach().nan_to_num()), float(value_loss.detach())))
            else:
                continue
            stopped_epoch = epoch + 1
            break
        policy_losses, value_losses = zip(*losses) if losses else ((0.0,), (0.0,))
        return {"policy_loss": float(np.mean(policy_losses)), "value_loss": float(np.mean(value_losses)),
                "approx_kl": float(np.mean(kls)), "clip_fraction": float(np.mean(clipped)) if clipped else 0.0,
                "epochs": float(stopped_epoch), "minibatch_steps": float(len(losses))}
