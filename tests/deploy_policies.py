"""Briefly trained, exported policies shared by the deployment tests (trained once per session)."""

from __future__ import annotations

from pathlib import Path

from helpers import TINY, describe, run_python

RECIPES = {"fetch_reach": ["--set", "train.n_epochs=1"],
           "bitflip": ["--config", "bitflip_10_dqn", "--set", "train.n_epochs=1"]}


def exported_policy(tmp_path_factory, name: str = "fetch_reach") -> Path:
    """The ONNX file of a tiny run of recipe ``name``, made once per test session."""
    root = tmp_path_factory.getbasetemp() / f"deploy-{name}"
    policy = root / "policy.onnx"
    if policy.is_file():
        return policy
    root.mkdir(exist_ok=True)
    result = run_python(["-m", "her_mpi.train", "--run-dir", root / "run", *RECIPES[name], *TINY])
    assert result.returncode == 0, describe(result)
    result = run_python(["-m", "her_mpi.export", "--checkpoint", root / "run", "--output", policy, "--no-verify"])
    assert result.returncode == 0, describe(result)
    return policy
