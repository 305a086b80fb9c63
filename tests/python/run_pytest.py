"""Runs the pytest suite in the directory given as argv[1] for CTest, or exits 77 (the code
CTest treats as "skipped" for this test) saying what is missing."""
import sys

try:
    import pytest
except ImportError:
    print(f"skipped: pytest is not installed for {sys.executable} "
          "(Debian: apt-get install python3-pytest; scripts/setup.sh does)")
    sys.exit(77)

# No cache directory: the suite runs from the source tree, which it must not write to.
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", sys.argv[1]]))
