import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))

from harness import pytest_runtest_makereport  # noqa: E402,F401  (a failure's report gets the daemons' warnings)
