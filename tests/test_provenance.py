"""provenance.yaml names the code's commit: from git in a checkout, from the stamp `git archive`
writes into a frozen copy (how experiments/tables.sh runs sweeps), and never the commit of a repository
the copy merely sits in."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT

pytestmark = pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                                reason="needs git and a git checkout of her_mpi")


def git(*args, cwd=ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def commit_seen_from(tree) -> str:
    result = subprocess.run([sys.executable, "-c", "from her_mpi.provenance import code_commit; print(code_commit())"],
                            cwd=tree, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tree)})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def frozen_copy(destination):
    destination.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD", "her_mpi"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(destination)], input=archive, check=True)
    return destination


def test_the_checkout_reports_its_own_commit():
    assert commit_seen_from(ROOT).split("+")[0] == git("rev-parse", "HEAD")


def test_a_git_archive_copy_inside_another_repository_reports_the_archived_commit(tmp_path):
    outer = tmp_path / "outer"
    outer.mkdir()
    git("init", "-q", cwd=outer)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "outer", cwd=outer)
    tree = frozen_copy(outer / "runs" / "sweeptree")
    assert commit_seen_from(tree) == git("rev-parse", "HEAD")
    assert commit_seen_from(tree) != git("rev-parse", "HEAD", cwd=outer)


def test_a_copy_without_git_or_stamp_says_unknown(tmp_path):
    tree = tmp_path / "plain"
    shutil.copytree(ROOT / "her_mpi", tree / "her_mpi", ignore=shutil.ignore_patterns("__pycache__", "commit.txt"))
    assert commit_seen_from(tree) == "unknown"
