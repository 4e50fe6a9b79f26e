"""PPO vs PPO-HER on predator-prey across interception distances (equal step budgets).

    python experiments/ppo_predator_prey.py --distances 2.0 1.0 0.5 --epochs 6
"""

from __future__ import annotations

import argparse

from common import run_variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--distances", type=float, nargs="+", default=[2.0, 1.0, 0.5])
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    variants = {}
    for d in args.distances:
        for recipe in ("ppo_her", "ppo"):
            variants[f"{recipe}_d{d:g}"] = (f"configs/predator_prey_{recipe}.yaml",
                                            [f"env.kwargs={{dims: 3, arena_size: 10.0, interception_distance: {d}, "
                                             f"prey_mode: random_direction}}"])
    run_variants("ppo_predator_prey", variants, args.epochs, title="PPO vs PPO-HER, predator-prey (np=2)")


if __name__ == "__main__":
    main()
