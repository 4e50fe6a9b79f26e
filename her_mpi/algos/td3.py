"""TD3+HER: twin critics, clipped double-Q target, target policy smoothing, delayed actor updates.

DDPG+HER (``algos/ddpg.py``) is this update with one critic, no target smoothing and a policy
delay of 1, exactly as Stable-Baselines3 writes it. All actions inside the agent are in [-1, 1];
the env's bounds are applied only at the env boundary and in the exported policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from her_mpi.algos.base import OffPolicyAgent, OffPolicyParams
from her_mpi.config import check
from her_mpi.nets import ActionScaler, CriticEnsemble, DeployablePolicy, flat_target_copy, mlp
from her_mpi.optim import SyncedAdam


@dataclass
class TD3Params(OffPolicyParams):
    lr_actor: float = 1e-3
    lr_critic: float = 1e-3
    action_l2: float = 1.0  # penalty on the squared [-1, 1] action in the actor loss
    noise_eps: float = 0.2  # exploration: Gaussian noise std, as a fraction of the action range
    random_eps: float = 0.3  # exploration: probability of a uniformly random action
    n_critics: int = 2
    policy_delay: int = 2  # critic updates per actor update
    target_noise: float = 0.2  # target policy smoothing std (fraction of the action range)
    target_noise_clip: float = 0.5
    target_update_every: int = 2  # with policy_delay: targets move when the actor does

    def validate(self, path: str) -> None:
        super().validate(path)
        for name in ("lr_actor", "lr_critic"):
            check(getattr(self, name) > 0, f"{path}.{name}", getattr(self, name), "a number > 0")
        for name in ("action_l2", "noise_eps", "target_noise", "target_noise_clip"):
            check(getattr(self, name) >= 0, f"{path}.{name}", getattr(self, name), "a number >= 0")
        check(0.0 <= self.random_eps <= 1.0, f"{path}.random_eps", self.random_eps, "a number in [0, 1]")
        check(self.n_critics in (1, 2), f"{path}.n_critics", self.n_critics, "1 or 2")
        check(self.policy_delay >= 1, f"{path}.policy_delay", self.policy_delay, "an integer >= 1")


class TD3(OffPolicyAgent):
    name = "td3"
    Params = TD3Params

    def __init__(self, spec, config, reward_fn, terminal_fn, seed_sequence):
        super().__init__(spec, config, reward_fn, terminal_fn, seed_sequence)
        if spec.discrete:
            raise ValueError(f"algo {self.name} needs continuous actions; {spec.env_id} is discrete "
                             f"(use algo: dqn)")
        p, in_dim, act_dim = self.params, self.inputs.out_dim, spec.action_dim
        self.actor = mlp(in_dim, p.hidden, act_dim, p.activation, output_activation=nn.Tanh)
        self.critic = CriticEnsemble(in_dim + act_dim, p.hidden, p.n_critics, p.activation)
        self.actor_optimizer = SyncedAdam(self.actor, p.lr_actor)
        self.critic_optimizer = SyncedAdam(self.critic, p.lr_critic)
        self.actor_target, actor_target_flat = flat_target_copy(self.actor)
        self.critic_target, critic_target_flat = flat_target_copy(self.critic)
        self.target_pairs = [(actor_target_flat, self.actor_optimizer.flat.param),
                             (critic_target_flat, self.critic_optimizer.flat.param)]
        self.nets.update(dict(actor=self.actor, critic=self.critic, actor_target=self.actor_target,
                              critic_target=self.critic_target))
        self.scaler = ActionScaler(spec.action_low, spec.action_high)
        self.n_critic_updates = 0
        self.last_actor_loss = torch.zeros(())

    def optimizers(self) -> dict:
        return {"actor": self.actor_optimizer, "critic": self.critic_optimizer}

    def act(self, obs: np.ndarray, g: np.ndarray, explore: bool) -> np.ndarray:
        with torch.inference_mode():
            action = self.actor(self.inputs(torch.from_numpy(obs), torch.from_numpy(g))).numpy()
        if not explore:
            return action
        p = self.params
        action = np.clip(action + p.noise_eps * self.rng.standard_normal(action.shape, np.float32), -1, 1)
        random_action = self.rng.uniform(-1.0, 1.0, action.shape).astype(np.float32)
        use_random = self.rng.random((len(action), 1)) < p.random_eps
        return np.where(use_random, random_action, action)

    def policy(self) -> DeployablePolicy:
        return DeployablePolicy(self.inputs, self.actor, self.scaler)

    def td_target(self, x_next: torch.Tensor, rewards: torch.Tensor, terminals: torch.Tensor) -> torch.Tensor:
        p = self.params
        with torch.no_grad():
            action_next = self.actor_target(x_next)
            if p.target_noise > 0:
                noise = torch.randn(action_next.shape, generator=self.torch_rng) * p.target_noise
                action_next = (action_next + noise.clamp(-p.target_noise_clip, p.target_noise_clip)).clamp(-1, 1)
            q_next = self.critic_target(torch.cat([x_next, action_next], -1)).min(0).values
            target = rewards + self.gamma * (1.0 - terminals) * q_next
            if p.clip_target:
                target = target.clamp(-1.0 / (1.0 - self.gamma), 0.0)
        return target

    def update(self, batch):
        p = self.params
        x = self.inputs(batch["obs"], batch["g"])
        x_next = self.inputs(batch["obs_next"], batch["g"])
        target = self.td_target(x_next, batch["rewards"], batch["terminals"])

        q = self.critic(torch.cat([x, batch["actions"]], -1))  # [n_critics, batch]
        td_error = target - q
        weights = batch.get("weights")
        squared = td_error.pow(2) if weights is None else weights * td_error.pow(2)
        critic_loss = squared.mean(-1).sum()
        self.critic_optimizer.backward(critic_loss, output=q)
        self.n_critic_updates += 1
        metrics = {"critic_loss": critic_loss.detach(), "q_mean": q.detach().mean(),
                   "target_mean": target.mean()}

        # Like baselines, the actor's gradient comes from the same critic parameters as the
        # critic's own gradient; both are averaged over ranks while the other is computed.
        update_actor = self.n_critic_updates % p.policy_delay == 0
        if update_actor:
            action = self.actor(x)
            q_pi = self.critic.members[0](torch.cat([x, action], -1))
            actor_loss = -q_pi.mean() + p.action_l2 * action.pow(2).mean()
            self.actor_optimizer.backward(actor_loss, output=action)
            self.last_actor_loss = actor_loss.detach()
        self.critic_optimizer.step()
        if update_actor:
            self.actor_optimizer.step()
        metrics["actor_loss"] = self.last_actor_loss
        return metrics, td_error[0].detach().abs()

    def state_dict(self) -> dict:
        return {**super().state_dict(), "n_critic_updates": self.n_critic_updates}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.n_critic_updates = state["n_critic_updates"]
