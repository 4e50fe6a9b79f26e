"""HTRPO batches built from a trained checkpoint as training builds them: what the HTRPO diagnostics share.

    with htrpo_from_checkpoint(run, n_episodes, "my_script.py") as (state, config, agent, learn):
        agent.policy_step = lambda batch: {}   # replace what the diagnostic measures instead
        learn()                                # fresh exploration episodes, agent.learn from the checkpoint

One process (one rank's share of an iteration), the exploration episodes from a fixed seed stream.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from park_runs import CHECKPOINT  # noqa: E402  (also puts this checkout's her_mpi first)

from her_mpi.checkpoint import load_checkpoint  # noqa: E402
from her_mpi.config import config_from_dict  # noqa: E402
from her_mpi.rollout import RolloutWorker  # noqa: E402
from her_mpi.trainer import build_agent  # noqa: E402


@contextlib.contextmanager
def htrpo_from_checkpoint(run: Path, n_episodes: int, script: str):
    """(state, config, agent, learn) of ``run``'s checkpoints/latest.pt; ``learn()`` restores the
    checkpoint's agent, collects ``n_episodes`` exploration episodes and runs ``agent.learn`` on them."""
    state = load_checkpoint(run / CHECKPOINT)
    config = config_from_dict(state["config"])
    if config.algo_name != "htrpo":
        raise SystemExit(f"{script}: {run} trains {config.algo_name!r}, expected an htrpo run")
    worker = RolloutWorker(config.env, n_episodes, np.random.SeedSequence(12345))
    try:
        agent = build_agent(config, worker.spec, worker.envs[0], np.random.SeedSequence(1))

        def learn() -> dict:
            agent.load_state_dict(state["agent"])
            agent.start_episodes(n_episodes)
            return agent.learn(worker.generate(lambda obs, g: agent.act(obs, g, explore=True), n_episodes))

        yield state, config, agent, learn
    finally:
        worker.close()
