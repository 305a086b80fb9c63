"""Runs tests/python_torch/test_*.py without needing pytest (the GPU machine may lack it): every
test_* function in order, a line per test, exit 1 when any failed. Exits 77 (CTest's "skipped")
saying what is missing when torch or a CUDA device is not there."""
import importlib.util
import pathlib
import sys
import time
import traceback

try:
    import torch
except ImportError as e:
    print(f"skipped: torch is not importable for {sys.executable} ({e})")
    sys.exit(77)
if not torch.cuda.is_available():
    print(f"skipped: torch {torch.__version__} sees no CUDA device")
    sys.exit(77)

here = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(here))
failed = 0
for path in sorted(here.glob("test_*.py")):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in sorted(n for n in vars(module) if n.startswith("test_")):
        start = time.time()
        try:
            getattr(module, name)()
            print(f"PASS {path.name}::{name} ({time.time() - start:.1f} s)", flush=True)
        except Exception:  # report every failure, run the rest
            failed += 1
            print(f"FAIL {path.name}::{name}\n{traceback.format_exc()}", flush=True)
print(f"{'FAILED' if failed else 'OK'}: {failed} failed")
sys.exit(1 if failed else 0)
