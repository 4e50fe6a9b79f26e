"""Algorithms by the name a config gives them (``algo: td3``).

The built-in algorithms are listed here by module path, so knowing the names and reading a
config never needs algorithm code; a name's class is imported the first time it is asked for.
Algorithm modules do not import this module or the config loader (they declare their
parameters with :mod:`her_mpi.settings`), so the dependencies run one way: config -> registry
-> algorithms -> settings.
"""

from __future__ import annotations

import importlib

BUILTIN = {
    "ddpg": "her_mpi.algos.ddpg:DDPG",
    "td3": "her_mpi.algos.td3:TD3",
    "sac": "her_mpi.algos.sac:SAC",
    "dqn": "her_mpi.algos.dqn:DQN",
    "htrpo": "her_mpi.algos.htrpo:HTRPO",
    "hpg": "her_mpi.algos.htrpo:HPG",
    "ppo": "her_mpi.algos.ppo:PPO",
}
_registered: dict[str, type] = {}  # algorithms added at run time (register_algorithm)


def register_algorithm(agent_class: type) -> None:
    """Make ``algo: <agent_class.name>`` valid; ``agent_class.Params`` (a dataclass) is its
    ``algo`` section."""
    name = agent_class.name
    if name in BUILTIN or _registered.get(name, agent_class) is not agent_class:
        raise ValueError(f"algorithm name {name!r} is already registered")
    _registered[name] = agent_class


def algorithm_names() -> list[str]:
    return sorted({*BUILTIN, *_registered})


def algorithm_class(name: str) -> type:
    """The agent class registered as ``name`` (KeyError if none is)."""
    if name in _registered:
        return _registered[name]
    module, _, attribute = BUILTIN[name].partition(":")
    return getattr(importlib.import_module(module), attribute)
