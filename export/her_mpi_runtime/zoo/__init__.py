"""Trained policies that ship with her_mpi_runtime, addressable as ``zoo:NAME`` wherever a policy
file is taken (``Policy("zoo:fetch_push")``, ``her_mpi.evaluate --policy zoo:fetch_push``, the ROS
nodes' ``model_path``, ``her_mpi.ros_sim``).

    python -m her_mpi_runtime.zoo           # list them with their cards

Each policy is ``NAME.onnx`` (written by ``python -m her_mpi.export``) beside its card,
``NAME.json``: task, algorithm, recipe, training env steps, success on 300 unseen episodes with
its 95% interval, sha256 and size.
"""

from __future__ import annotations

import json
from pathlib import Path

ZOO_DIR = Path(__file__).resolve().parent
PREFIX = "zoo:"


def names() -> list[str]:
    return sorted(p.stem for p in ZOO_DIR.glob("*.onnx"))


def card(name: str) -> dict:
    path = ZOO_DIR / f"{name}.json"
    if not path.is_file():  # e.g. an export whose --card step failed
        raise FileNotFoundError(f"zoo:{name} has no card {path}; expected one beside every policy (write both "
                                f"with python -m her_mpi.export --checkpoint RUN --output {ZOO_DIR / name}.onnx --card)")
    return json.loads(path.read_text())


def resolve(policy: str | Path) -> Path:
    """The file behind ``zoo:NAME``, or ``policy`` itself as a path."""
    text = str(policy)
    if not text.startswith(PREFIX):
        return Path(policy)
    name = text[len(PREFIX):]
    if name not in names():
        raise FileNotFoundError(f"no zoo policy {name!r}; the zoo has {', '.join(names()) or 'none'} "
                                "(python -m her_mpi_runtime.zoo lists them)")
    return ZOO_DIR / f"{name}.onnx"


def describe() -> str:
    lines = [f"{'name':26s} {'task':22s} {'algorithm':10s} {'env steps':>10s}  success on 300 unseen episodes [95%]  size"]
    for name in names():
        c = card(name)
        low, high = c["success_interval_95"]
        lines.append(f"{PREFIX + name:26s} {c['env_id']:22s} {c['algorithm']:10s} {c['train_env_steps']:>10,d}  "
                     f"{c['success_rate']:.3f} [{low:.3f}, {high:.3f}]{'':14s}{c['size_bytes'] / 1e3:.0f} kB")
    return "\n".join(lines)
