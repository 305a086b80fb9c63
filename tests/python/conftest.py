"""Shared set-up of the Python suite: the package is imported from the source tree (ctest sets
PYTHONPATH and PIPEOFFLOAD_LIBRARY, and PYTHONDONTWRITEBYTECODE so the tree stays clean; run by
hand, python/ is put on the path here and the library is looked up as the package does)."""
import pathlib
import sys

import pytest

SOURCE_DIR = pathlib.Path(__file__).resolve().parents[2]
if str(SOURCE_DIR / "python") not in sys.path:
    sys.path.insert(0, str(SOURCE_DIR / "python"))

import pipeoffload as po  # noqa: E402  (after the path is set)


@pytest.fixture
def unit():
    """Unit costs (F = B = W = 1, free P2P), as the golden files and pipeoffload.md use."""
    return po.Costs.unit(0.25)
