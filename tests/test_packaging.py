"""The package as users get it: a built wheel, installed without the checkout, runs its recipes;
ROS 2 wheels only in the ``ros`` extra; the license is declared."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from email.message import Message
from email.parser import Parser

import pytest

from helpers import ROOT, describe

# what a wheel is built from: the source tree without runs, caches, tests or benchmarks
NOT_SOURCE = shutil.ignore_patterns(".git", "runs", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis",
                                    ".pytest_cache", "tests", "bench", "experiments", "docs", "site")
ROS_WHEELS = {"ros-rclpy", "ros-std-msgs", "ros-geometry-msgs", "ros-diagnostic-msgs", "ros-lifecycle-msgs"}


def run(args, cwd, env=None, timeout=300):
    result = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                            env=env, timeout=timeout)
    return result


def metadata_of(wheel) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(archive.read(name).decode())


def requirement_names(metadata, extra: str | None) -> set[str]:
    names = set()
    for requirement in metadata.get_all("Requires-Dist") or []:
        name, _, marker = requirement.partition(";")
        in_extra = f'extra == "{extra}"' in marker if extra else not marker.strip()
        if in_extra:
            names.add(name.strip().split("<")[0].split(">")[0].split("=")[0].split("!")[0].strip())
    return names


def build_wheel(project, wheel_dir, cwd):
    # an absolute path: a bare directory name would be looked up on the package index
    result = run(["-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", wheel_dir,
                  project.resolve()], cwd=cwd)
    assert result.returncode == 0, describe(result)
    (wheel,) = wheel_dir.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def main_wheel(tmp_path_factory):
    root = tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, root / "source", ignore=NOT_SOURCE)  # building writes build/ and *.egg-info
    return build_wheel(root / "source", root / "wheels", root)


def test_wheel_runs_the_packaged_recipes_outside_the_checkout(main_wheel, tmp_path):
    wheel, site, elsewhere = main_wheel, tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert wheel.name.startswith("her_mpi-")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {"her_mpi/configs/default.yaml", "her_mpi/configs/fetch_push_td3.yaml",
            "her_mpi_runtime/ros_node.py", "her_mpi_runtime/lifecycle_node.py",
            "her_mpi_runtime/zoo/fetch_push.onnx", "her_mpi_runtime/zoo/fetch_push.json"} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(names)

    result = run(["-m", "pip", "install", "--no-deps", "--target", site, wheel], cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    env = dict(os.environ, PYTHONPATH=str(site))
    result = run(["-c", "import her_mpi, her_mpi_runtime; print(her_mpi.__file__); print(her_mpi_runtime.__file__)"],
                 cwd=elsewhere, env=env)
    assert result.returncode == 0, describe(result)
    assert all(line.startswith(str(site)) for line in result.stdout.split()), result.stdout  # not the checkout

    result = run(["-m", "her_mpi.train", "--list-recipes"], cwd=elsewhere, env=env)
    assert result.returncode == 0, describe(result)
    assert "fetch_push_td3" in result.stdout and "bitflip_10_dqn" in result.stdout, result.stdout
    result = run(["-m", "her_mpi.train", "--print-config", "--config", "fetch_push_td3"], cwd=elsewhere, env=env)
    assert result.returncode == 0, describe(result)
    assert "FetchPush-v4" in result.stdout and "td3" in result.stdout, result.stdout
    assert not any(elsewhere.iterdir()), "printing a config wrote files"


def test_ros_wheels_are_an_extra_included_in_test(main_wheel, tmp_path):
    shutil.copytree(ROOT / "export", tmp_path / "export", symlinks=False, ignore=NOT_SOURCE)
    runtime_wheel = build_wheel(tmp_path / "export", tmp_path / "wheels", tmp_path)
    runtime = metadata_of(runtime_wheel)
    assert requirement_names(runtime, None) == {"numpy", "onnxruntime"}  # the robot-side kit stays lean
    assert ROS_WHEELS <= requirement_names(runtime, "ros")
    assert runtime["License-Expression"] == "MIT"
    with zipfile.ZipFile(runtime_wheel) as archive:
        license_text = archive.read(next(n for n in archive.namelist() if n.endswith("licenses/LICENSE"))).decode()
    assert license_text == (ROOT / "LICENSE").read_text() and license_text.startswith("MIT License")
    # the trained policies ship with the robot-side kit and load from it, outside the checkout
    with zipfile.ZipFile(runtime_wheel) as archive:
        shipped = {n for n in archive.namelist() if n.startswith("her_mpi_runtime/zoo/")}
    assert {f"her_mpi_runtime/zoo/{p.name}" for p in (ROOT / "export/her_mpi_runtime/zoo").glob("*.onnx")} <= shipped
    site, elsewhere = tmp_path / "runtime_site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = run(["-m", "pip", "install", "--no-deps", "--target", site, runtime_wheel], cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    result = run(["-c", "import sys; from her_mpi_runtime import Policy; p = Policy('zoo:fetch_reach'); "
                        "print(p.path); print('torch' in sys.modules)"],
                 cwd=elsewhere, env=dict(os.environ, PYTHONPATH=str(site)))
    assert result.returncode == 0, describe(result)
    path, torch_loaded = result.stdout.split()
    assert path.startswith(str(site)) and torch_loaded == "False"

    main = metadata_of(main_wheel)
    assert not any(name.startswith("ros-") for name in requirement_names(main, None)), requirement_names(main, None)
    assert ROS_WHEELS <= requirement_names(main, "ros")
    assert ROS_WHEELS | {"hypothesis", "pytest"} <= requirement_names(main, "test")
    assert "MIT" in (main["License-Expression"] or main["License"] or "")
