"""DDPG+HER, the OpenAI baselines recipe: TD3's update with one critic, no target smoothing,
an actor step after every critic step, and targets moved once per cycle (polyak 0.95)."""

from __future__ import annotations

from dataclasses import dataclass

from her_mpi.algos.td3 import TD3, TD3Params


@dataclass
class DDPGParams(TD3Params):
    n_critics: int = 1
    policy_delay: int = 1
    target_noise: float = 0.0
    target_update_every: int = 0
    polyak: float = 0.95


class DDPG(TD3):
    name = "ddpg"
    Params = DDPGParams
