"""Success curves of recipes at np=2, plotted together (experiments/results/<name>.{json,png}).

    python experiments/learning_curve.py configs/fetch_push_ddpg.yaml configs/fetch_push_td3.yaml --epochs 30 --name push

--collect re-summarises runs already in runs/bench/<name>/<recipe> (finished or still going)
without training, e.g. after runs were started by hand with `--run-dir runs/bench/<name>/<recipe>`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import collect, run_variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--name", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--collect", action="store_true", help="summarise existing runs, do not train")
    args = parser.parse_args()
    if args.collect:
        collect(args.name, {Path(c).stem: c for c in args.configs}, {Path(c).stem: args.overrides for c in args.configs})
    else:
        run_variants(args.name, {Path(c).stem: (c, args.overrides) for c in args.configs}, args.epochs, args.ranks)


if __name__ == "__main__":
    main()
