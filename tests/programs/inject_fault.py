"""Train normally, except that rank 1 raises during its third gradient update.

    mpirun -np 2 python tests/programs/inject_fault.py [her_mpi.train arguments]
"""

import sys

from her_mpi import mpi
from her_mpi.algos.td3 import TD3
from her_mpi.train import main

original_update = TD3.update
calls = {"n": 0}


def faulty_update(self, batch):
    calls["n"] += 1
    if mpi.rank() == 1 and calls["n"] == 3:
        raise RuntimeError("injected fault on rank 1")
    return original_update(self, batch)


TD3.update = faulty_update
sys.exit(main(sys.argv[1:]))
