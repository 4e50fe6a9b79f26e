"""Algorithms by config name. Each class carries its ``name`` and its ``Params`` (the config's
``algo`` section); :mod:`her_mpi.registry` knows them by name without importing this package."""

from her_mpi.algos.ddpg import DDPG
from her_mpi.algos.dqn import DQN
from her_mpi.algos.htrpo import HPG, HTRPO
from her_mpi.algos.ppo import PPO
from her_mpi.algos.sac import SAC
from her_mpi.algos.td3 import TD3

ALGORITHMS = {cls.name: cls for cls in (DDPG, TD3, SAC, DQN, HTRPO, HPG, PPO)}
