"""Train normally, except that one rank meets a NaN in one gradient update.

    mpirun -np 2 python tests/programs/inject_nan.py RANK UPDATE reward|parameter [her_mpi.train arguments]

``reward``: that rank's batch gets a NaN reward, so its critic loss and gradient are NaN; the
averaged gradient carries the NaN to every rank. ``parameter``: after the update, a NaN is
written into that rank's actor weights only (as a broken optimizer step would), which only that
rank can see. Either way every rank must stop before a checkpoint is written from it.
"""

import sys

import torch

from her_mpi import mpi
from her_mpi.algos.actor_critic import ActorCriticAgent
from her_mpi.train import main

rank, update, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
original_update = ActorCriticAgent.update
calls = {"n": 0}


def update_with_nan(self, batch):
    calls["n"] += 1
    poisoned = mpi.rank() == rank and calls["n"] == update
    if poisoned and mode == "reward":
        batch["rewards"][0] = float("nan")
    result = original_update(self, batch)
    if poisoned and mode == "parameter":
        with torch.no_grad():
            next(self.actor.parameters()).view(-1)[0] = float("nan")
    return result


ActorCriticAgent.update = update_with_nan
sys.exit(main(sys.argv[4:]))
