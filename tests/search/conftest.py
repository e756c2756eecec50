"""The search tests share tests/support.py with the rest of the suite: put its folder on the path
also when only this folder is run."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
