"""``python -m her_mpi_runtime.zoo``: list the policies that ship with her_mpi_runtime."""

from her_mpi_runtime.zoo import describe

print(describe())
