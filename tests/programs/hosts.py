"""Print each rank's host as MPI sees it: ``RESULT {"names": [...]}`` (after an allgather between hosts)."""

import json

from mpi4py import MPI

names = MPI.COMM_WORLD.allgather(MPI.Get_processor_name())
if MPI.COMM_WORLD.Get_rank() == 0:
    print("RESULT " + json.dumps({"names": names}), flush=True)
