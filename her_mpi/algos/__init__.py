"""Algorithms by config name. Each class carries its ``name`` and its ``Params`` (the config's
``algo`` section); importing this package registers every name with the config."""

from her_mpi.algos.ddpg import DDPG
from her_mpi.algos.dqn import DQN
from her_mpi.algos.htrpo import HPG, HTRPO
from her_mpi.algos.ppo import PPO
from her_mpi.algos.sac import SAC
from her_mpi.algos.td3 import TD3
from her_mpi.config import register_algorithm

ALGORITHMS = {cls.name: cls for cls in (DDPG, TD3, SAC, DQN, HTRPO, HPG, PPO)}
for _name, _cls in ALGORITHMS.items():
    register_algorithm(_name, _cls.Params)
