"""her_mpi.train on ranks whose clocks disagree: rank r's clock runs r x 0.4 s ahead, so eight ranks
straddle at least two second boundaries whenever they start.

    mpirun -np 8 python tests/programs/train_clock_skewed.py [her_mpi.train arguments]
"""

import os
import sys
import time

from her_mpi.train import main

offset = 0.4 * int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
real_strftime = time.strftime


def skewed_strftime(fmt, t=None):
    return real_strftime(fmt, time.localtime(time.time() + offset) if t is None else t)


time.strftime = skewed_strftime
sys.exit(main(sys.argv[1:]))
