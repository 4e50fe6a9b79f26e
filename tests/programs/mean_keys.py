"""mean_over_ranks with keys that differ between ranks: every rank gets the same clear error.

    mpirun -np 2 python tests/programs/mean_keys.py
"""

import json

from her_mpi import mpi

same = mpi.mean_over_ranks({"loss": float(mpi.rank()), "q": 1.0})
values = {"loss": 1.0, "q_mean": 2.0} if mpi.rank() == 0 else {"loss": 1.0, "test_return": 3.0}
try:
    mpi.mean_over_ranks(values)
    error = None
except ValueError as exc:
    error = str(exc)
errors = mpi.allgather_object(error)
if mpi.is_root():
    print("RESULT " + json.dumps({"same_keys": same, "errors": errors}), flush=True)
