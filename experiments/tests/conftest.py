import sys
from pathlib import Path

# the package's test helpers (tests/helpers.py, fake_runs.py; tests/ is not a package); the package's tests
# import nothing from here
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
# the research scripts' own folder, on the path as when they run (`from common import ...`)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
