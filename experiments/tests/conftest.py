import sys
from pathlib import Path

# the package's test helpers (tests/ is not a package); the package's tests import nothing from here
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
