"""her_mpi: MPI-parallel training of goal-conditioned policies with Hindsight Experience Replay."""

__version__ = "0.1.0"
