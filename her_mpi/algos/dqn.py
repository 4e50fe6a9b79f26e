"""DQN and Double-DQN with hindsight replay for discrete actions (bit flipping).

Q(s, g) outputs one value per action; epsilon-greedy exploration; a Polyak-averaged target
network; Huber or squared TD loss weighted by prioritized replay's importance weights when
``replay.prioritized`` is on. Double DQN picks the next action with the online network and
evaluates it with the target network. The exported policy outputs the greedy action index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch.nn import functional as F

from her_mpi.algos import fast_updates
from her_mpi.algos.base import OffPolicyAgent, OffPolicyParams
from her_mpi.cnn import network_body
from her_mpi.settings import ConfigError, check, setting
from her_mpi.nets import DeployablePolicy, GreedyAction, flat_target_copy
from her_mpi.optim import SyncedAdam


@dataclass
class DQNParams(OffPolicyParams):
    RENAMED = {"lr": "lr_q"}  # deprecated name -> current name (lr_<network> for every algorithm)

    hidden: list[int] = field(default_factory=lambda: [256])
    lr_q: float = setting(1e-3, "Adam learning rate of the Q-network")
    double: bool = setting(True, "Double DQN: the online network picks the next action, the target network "
                                 "values it")
    loss: Literal["huber", "mse"] = setting("huber", "TD loss: huber (delta 1) or mse")
    epsilon: float = setting(0.1, "exploration: probability of a uniformly random action while collecting")
    # Temporally extended epsilon-greedy (Dabney et al. 2021, "ez-greedy", with uniform durations):
    # single random steps dither in place where the dynamics carry momentum (Ms. Pac-Man keeps
    # moving until a new direction takes), held ones reach other parts of the map.
    epsilon_hold: int = setting(1, "steps a random exploration action is kept: each one starts with probability "
                                   "epsilon and lasts 1..epsilon_hold steps (uniform); 1 is plain epsilon-greedy")

    def validate(self, path: str) -> None:
        super().validate(path)
        check(self.lr_q > 0, f"{path}.lr_q", self.lr_q, "a number > 0")
        check(0.0 <= self.epsilon <= 1.0, f"{path}.epsilon", self.epsilon, "a number in [0, 1]")
        check(self.epsilon_hold >= 1, f"{path}.epsilon_hold", self.epsilon_hold, "an integer >= 1")


class DQN(OffPolicyAgent):
    name = "dqn"
    Params = DQNParams

    def __init__(self, spec, config, goal_fns, seed_sequence):
        super().__init__(spec, config, goal_fns, seed_sequence)
        if not spec.discrete:
            raise ConfigError(f"algo: dqn needs discrete actions but {spec.env_id} has continuous "
                              f"actions (use ddpg, td3 or sac)")
        p = self.params
        # the paper's CNN for image observations (hidden = its FC layers), else an MLP
        self.q_network = network_body(spec, self.inputs.out_dim, p.hidden, spec.n_actions, p.activation)
        self.q_target, q_target_flat = flat_target_copy(self.q_network)
        self.optimizer = SyncedAdam(self.q_network, p.lr_q)
        self.target_pairs.append((q_target_flat, self.optimizer.flat.param))
        self.nets.update({"q_network": self.q_network, "q_target": self.q_target})
        self.start_episodes(0)  # held-exploration state, sized by the rollout that uses it

    def optimizers(self) -> dict:
        return {"q_network": self.optimizer}

    def act(self, obs: np.ndarray, g: np.ndarray, explore: bool) -> np.ndarray:
        with torch.inference_mode():
            action = self.q_network(self.inputs(torch.from_numpy(obs), torch.from_numpy(g))).argmax(-1).numpy()
        if explore:
            action = self.explore(action)
        return action.astype(np.int64)[:, None]

    def start_episodes(self, n: int) -> None:
        self.held_action, self.hold_left = np.zeros(n, np.int64), np.zeros(n, np.int64)

    def explore(self, greedy: np.ndarray) -> np.ndarray:
        """Epsilon-greedy; with epsilon_hold > 1 a random action, once drawn, is kept for a
        random number of steps (envs already holding one do not draw a new one)."""
        n = len(greedy)
        random_action = self.random_actions(n)[:, 0]
        starts = self.rng.random(n) < self.params.epsilon
        if self.params.epsilon_hold == 1:
            return np.where(starts, random_action, greedy)
        if len(self.hold_left) != n:  # act() outside a rollout's episodes
            self.start_episodes(n)
        durations = self.rng.integers(1, self.params.epsilon_hold + 1, n)
        starts &= self.hold_left == 0
        self.held_action = np.where(starts, random_action, self.held_action)
        self.hold_left = np.where(starts, durations, self.hold_left)
        action = np.where(self.hold_left > 0, self.held_action, greedy)
        self.hold_left = np.maximum(self.hold_left - 1, 0)
        return action

    def policy(self) -> DeployablePolicy:
        return DeployablePolicy(self.inputs, self.q_network, GreedyAction())

    def next_value(self, x_next):
        q_next_all = self.q_target(x_next)
        if self.params.double:  # the online network picks the action, the target network values it
            next_action = self.q_network(x_next).argmax(-1, keepdim=True)
            return q_next_all.gather(-1, next_action).squeeze(-1), None
        return q_next_all.max(-1).values, None

    def update(self, batch):
        """One (Double) DQN update in plain autograd; ``algo.fast_update`` (the default) runs the same
        through a hand-derived pass (her_mpi/algos/fast_updates.py), equal to float tolerance."""
        if self.params.fast_update:
            return fast_updates.dqn_update(self, batch)
        x, x_next = self.input_pair(batch)
        with torch.no_grad():
            target = self.td_target(batch, x_next)  # r + gamma * Q'(s', argmax_a Q(s', a)), clipped
        q = self.q_network(x).gather(-1, batch["actions"]).squeeze(-1)  # the taken action's value
        per_sample = F.huber_loss(q, target, reduction="none", delta=1.0) if self.params.loss == "huber" \
            else (target - q).pow(2)
        loss = (batch.get("weights", 1.0) * per_sample).mean()  # prioritized replay's weights, else 1
        self.optimizer.minimize(loss)
        return {"q_loss": loss.detach(), "q_mean": q.detach().mean(), "target_mean": target.mean()}, \
            (target - q).detach().abs()
