"""The package as CMake installs it: the library and the package go into a scratch prefix
(their install components only), and a fresh interpreter with no hints but PYTHONPATH finds
the installed library. Also the build-tree lookup through PIPEOFFLOAD_BUILD_DIR. Needs the build
tree, which ctest names in PO_TEST_BUILD_DIR."""
import os
import pathlib
import subprocess
import sys

import pytest

BUILD_DIR = os.environ.get("PO_TEST_BUILD_DIR")
needs_build = pytest.mark.skipif(not BUILD_DIR, reason="PO_TEST_BUILD_DIR is not set (ctest "
                                                       "sets it to the build tree)")

PROBE = ("import pipeoffload as po; "
         "s = po.compile(stages=4, microbatches=8, costs=po.Costs.unit()); "
         "print(po.library_path); print(len(s.ops(0)))")


def run_probe(env, cwd):
    clean = {k: v for k, v in os.environ.items()
             if k not in ("PIPEOFFLOAD_LIBRARY", "PIPEOFFLOAD_BUILD_DIR", "PYTHONPATH")}
    clean.update(env)
    result = subprocess.run([sys.executable, "-c", PROBE], env=clean, cwd=cwd,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@needs_build
def test_installed_package_finds_installed_library(tmp_path):
    prefix = tmp_path / "prefix"
    for component in ("c_api", "python"):
        subprocess.run(["cmake", "--install", BUILD_DIR, "--prefix", str(prefix),
                        "--component", component], check=True, capture_output=True)
    site = prefix / os.environ.get("PO_TEST_PYTHON_INSTALL_DIR", "lib/python3/site-packages")
    library, count = run_probe({"PYTHONPATH": str(site)}, cwd=tmp_path)
    assert pathlib.Path(library).resolve().is_relative_to(prefix.resolve())
    assert count == "32"


@needs_build
def test_build_tree_lookup(tmp_path):
    from conftest import SOURCE_DIR
    library, count = run_probe({"PYTHONPATH": str(SOURCE_DIR / "python"),
                                "PIPEOFFLOAD_BUILD_DIR": BUILD_DIR}, cwd=tmp_path)
    assert pathlib.Path(library).parent.resolve() == pathlib.Path(BUILD_DIR).resolve()
    assert count == "32"
