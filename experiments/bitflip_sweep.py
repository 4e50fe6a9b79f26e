"""Bit flipping with DQN: success vs env steps for n bits, with/without HER and prioritized replay.

    python experiments/bitflip_sweep.py --bits 10 20 30 40 50 --epochs 5

The HER paper solves 50 bits with HER while DQN without it fails above ~15 bits. Each epoch is
50 cycles x 16 episodes per rank (np=2).
"""

from __future__ import annotations

import argparse

from common import run_variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bits", type=int, nargs="+", default=[10, 20, 30, 40, 50])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--name", default="bitflip_sweep")
    args = parser.parse_args()
    variants = {}
    for n in args.bits:
        for her in (True, False):
            for prioritized in (False, True):
                label = f"{n}bits_{'her' if her else 'noher'}{'_per' if prioritized else ''}"
                variants[label] = ("configs/bitflip_10_dqn.yaml",
                                   [f"env.kwargs={{n_bits: {n}}}", f"replay.strategy={'future' if her else 'none'}",
                                    f"replay.prioritized={str(prioritized).lower()}"])
    run_variants(args.name, variants, args.epochs, title="DQN on n-bit flipping (np=2)")


if __name__ == "__main__":
    main()
