"""The documentation: the site builds with warnings as errors (every internal link, anchor and image
resolves, every page is in the navigation, the API reference imports), and the READMEs' own links
point at files that exist."""

import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT

pytest.importorskip("mkdocs", reason="the docs tools: pip install -e '.[docs]'")

LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            capture_output=True, text=True, timeout=600, cwd=ROOT,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    site = tmp_path / "site"
    for page in ("index.html", "clusters/index.html", "deployment/index.html", "results/index.html",
                 "reference/index.html", "algorithms/htrpo/index.html"):
        assert (site / page).is_file(), page
    settings = (site / "recipes" / "index.html").read_text()
    assert "train.hang_timeout_s" in settings and "fetch_push_ddpg_kfac" in settings  # generated from the code
    assert "her_mpi.run_status.verdict" in (site / "reference" / "index.html").read_text()


@pytest.mark.parametrize("readme", ["README.md", "experiments/README.md"])
def test_a_readmes_links_point_at_files_that_exist(readme):
    path = ROOT / readme
    missing = [target for target, _ in LINK.findall(path.read_text())
               if not target.startswith(("http://", "https://")) and not (path.parent / target).exists()]
    assert not missing, f"{readme} links to missing files: {missing}"


def test_the_readme_stays_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert not re.search(r"\bissues? \d+|\b[0-9a-f]{7,40}\b|\b20\d\d-\d\d-\d\d\b", text), "history belongs in the docs"
