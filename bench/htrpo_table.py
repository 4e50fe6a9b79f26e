"""HTRPO ablations on 8-bit flipping and continuous FetchReach, one seed each (screening).

The bit-flipping rows of the seed's Table 1 are `bench/tables.sh htrpo_bits` (the authors' 16- and
32-bit settings over three seeds, from all-zero bits as in the paper).

    python bench/htrpo_table.py --part ablations --epochs 12  # on 8-bit flipping
    python bench/htrpo_table.py --part fetch --epochs 30      # continuous FetchReach (and Push)
"""

from __future__ import annotations

import argparse

from common import run_variants

BITS = "configs/bitflip_8_htrpo.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["ablations", "fetch"], required=True)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--push", action="store_true", help="also continuous FetchPush (hours)")
    args = parser.parse_args()
    if args.part == "ablations":
        variants = {
            "htrpo": (BITS, []),
            "kl_analytic": (BITS, ["algo.kl=analytic"]),
            "kl_logratio": (BITS, ["algo.kl=logratio"]),
            "no_goal_filtering": (BITS, ["algo.goal_filtering=false"]),
            "no_weighted_is": (BITS, ["algo.weighted_is=false"]),
            "dense_reward": (BITS, ["algo.reward=dense"]),
            "trpo_no_hindsight": (BITS, ["algo.hindsight=false"]),
            "hpg": (BITS, ["algo=hpg", "algo.n_goals=32", "algo.gae_lambda=0.95"]),
        }
    else:
        variants = {"htrpo_fetch_reach": ("configs/fetch_reach_htrpo.yaml", [])}
        if args.push:
            variants["htrpo_fetch_push"] = ("configs/fetch_reach_htrpo.yaml", ["env.id=FetchPush-v4"])
    run_variants(f"htrpo_{args.part}", variants, args.epochs, title=f"HTRPO {args.part} (np=2)")


if __name__ == "__main__":
    main()
