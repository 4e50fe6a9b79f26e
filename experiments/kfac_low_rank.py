"""How well low-rank K-FAC (``algo.kfac.rank``) approximates the exact damped inverses, on the
Kronecker factors of a real K-FAC training run.

    python experiments/kfac_low_rank.py CHECKPOINT [CHECKPOINT ...] [--ranks 8 16 32 64] [--name kfac_low_rank]

For every factor F of dimension > 4 x rank (the ones ``rank`` makes low rank), with the damping
delta the factored scheme gives it, the error of the low-rank inverse M_k against the exact
(F + delta I)^-1 on vectors distributed like the ones it multiplies (layer inputs for A, output
gradients for G, whose second moment is F itself):

    sqrt(tr((M_k - M) F (M_k - M)) / tr(M F M))

Writes experiments/results/<name>.json and .png (error per factor against rank).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, save  # noqa: E402

from her_mpi.optim.kfac import factored_pi, low_rank_inverse  # noqa: E402


def optimizer_factors(state: dict) -> dict[str, list]:
    """{network: [(A, G), ...]} from a checkpoint's K-FAC optimizer states."""
    found = {}

    def walk(node, path):
        if isinstance(node, dict):
            if "factors" in node and "n_steps" in node:
                found[path.strip("/")] = [(A, G) for A, G, _ in node["factors"]]
                return
            for key, value in node.items():
                walk(value, f"{path}/{key}")

    walk(state, "")
    return found


def relative_error(F: torch.Tensor, delta: float, k: int) -> float:
    n = F.shape[0]
    F64 = F.double()
    exact = torch.linalg.inv(F64 + delta * torch.eye(n, dtype=torch.float64))
    packed = low_rank_inverse(F, delta, k).double()
    approx = packed[n + 1, 0] * torch.eye(n, dtype=torch.float64) + packed[:n] @ torch.diag(packed[n]) @ packed[:n].T
    error = approx - exact
    return math.sqrt(float(torch.trace(error @ F64 @ error)) / float(torch.trace(exact @ F64 @ exact)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", type=Path, help="K-FAC run checkpoints (RUN/checkpoints/latest.pt)")
    parser.add_argument("--ranks", nargs="+", type=int, default=[8, 16, 32, 64])
    parser.add_argument("--damping", type=float, default=None, help="default: the run's algo.kfac.damping")
    parser.add_argument("--name", default="kfac_low_rank")
    args = parser.parse_args()
    rows = []
    for checkpoint in args.checkpoints:
        if not checkpoint.is_file():
            parser.error(f"checkpoint {str(checkpoint)!r} does not exist")
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        damping = args.damping or state["config"]["algo"]["kfac"]["damping"]
        networks = optimizer_factors(state)
        if not networks:
            parser.error(f"{checkpoint} holds no K-FAC factors (trained with algo.optimizer adam?)")
        for network, layers in networks.items():
            for index, (A, G) in enumerate(layers):
                pi, root = factored_pi(A, G), math.sqrt(damping)
                for side, F, delta in (("A", A, pi * root), ("G", G, root / pi)):
                    n = F.shape[0]
                    errors = {str(k): relative_error(F, delta, k) for k in args.ranks if n > 4 * k}
                    if not errors:
                        continue
                    eigenvalues = torch.linalg.eigvalsh(F.double()).flip(0).clamp_min(0).numpy()
                    rows.append({"checkpoint": str(checkpoint), "env_steps": state.get("env_steps"),
                                 "factor": f"{network} layer {index} {side}", "dim": n, "delta": delta,
                                 "eigenvalues_1_8_32_64": [float(eigenvalues[i]) for i in (0, 7, 31, 63) if i < n],
                                 "relative_error": errors})
                    print(f"{rows[-1]['factor']:40} n={n} delta={delta:.3g} "
                          + " ".join(f"k{k}: {e:.4f}" for k, e in errors.items()), flush=True)
    summary = {str(k): {"median": float(np.median([r["relative_error"][str(k)] for r in rows if str(k) in r["relative_error"]])),
                        "max": float(np.max([r["relative_error"][str(k)] for r in rows if str(k) in r["relative_error"]]))}
               for k in args.ranks if any(str(k) in r["relative_error"] for r in rows)}
    print("relative error over all factors:", summary)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for row in rows:
        ks = [int(k) for k in row["relative_error"]]
        ax.plot(ks, list(row["relative_error"].values()), color="tab:blue", alpha=0.35, marker=".")
    ax.plot([int(k) for k in summary], [v["median"] for v in summary.values()], color="k", marker="o", label="median")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("rank k (eigen-directions kept per factor)")
    ax.set_ylabel("relative error of the preconditioner")
    ax.set_title("Low-rank K-FAC vs exact damped inverses (one line per factor)")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{args.name}.png", dpi=120)
    plt.close(fig)
    save(args.name, {"ranks": args.ranks, "summary": summary, "factors": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
