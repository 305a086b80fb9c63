"""Our V schedules against torch.distributed.pipelining itself (issue 15), CPU only.

For zbv and dualpipev over a few (p, m): po-schedule's compute-only and compute+comms CSVs load
with torch's own action parser and pass torch's _validate_schedule, whose inferred stage-to-rank
mapping must be V (stage s on rank s for s < p, else 2p - 1 - s); torch's dry-run simulator
(_simulate_comms_compute) runs the comms file to the end; and the order torch's own generator
(ScheduleZBVZeroBubble / ScheduleDualPipeV._calculate_single_rank_operations) writes, dumped the
way _dump_csv does, imports with po-schedule (no --stages) and exports to exactly our CSV.
Writes tests/data's torch_*.csv fixtures' equivalents under the work directory too, so they can
be compared with (or copied over) the checked-in ones.

usage: torch_schedule_check.py PO_SCHEDULE WORK_DIR [SOURCE_DIR]
Exit 77 (skipped, with the reason) when torch cannot be imported; 1 with the reason on a mismatch.
"""
import csv
import filecmp
import os
import subprocess
import sys

try:
    import torch  # noqa: F401
    from torch.distributed.pipelining import schedules as torch_schedules
except Exception as error:  # ImportError, or a torch build without distributed
    print(f"skipped: torch.distributed.pipelining is not importable ({error})")
    sys.exit(77)

_Action = torch_schedules._Action


def load(path):
    """A CSV as torch's _load_csv reads it: rank -> [_Action or None]."""
    with open(path, newline="") as f:
        return {rank: [_Action.from_str(cell) for cell in row]
                for rank, row in enumerate(csv.reader(f))}


def torch_order(family, p, m):
    """torch's own compute-only order, from the generator the schedule class runs in __init__
    (called on a bare instance: the generators read only these attributes)."""
    cls = {"zbv": torch_schedules.ScheduleZBVZeroBubble,
           "dualpipev": torch_schedules.ScheduleDualPipeV}[family]
    schedule = object.__new__(cls)
    schedule.pp_group_size = p
    schedule.num_stages = 2 * p
    schedule._num_stages = 2 * p
    schedule._n_microbatches = m
    schedule.n_local_stages = 2
    return {rank: schedule._calculate_single_rank_operations(rank) for rank in range(p)}


def dump(order, path):
    """As _dump_csv: one csv.writer row per rank, None as an empty cell."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        for rank in sorted(order):
            writer.writerow(order[rank])


def po(binary, *args):
    result = subprocess.run([binary, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"po-schedule {' '.join(args)}: exit {result.returncode}\n"
                           f"{result.stdout}{result.stderr}")
    return result.stdout


def main():
    binary, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    failures = []
    checked = 0
    for family in ("zbv", "dualpipev"):
        for p in (2, 3, 4):
            ms = [2 * p, 3 * p] + ([2 * p - 1, 1] if family == "zbv" else [])
            for m in ms:
                name = f"{family}_p{p}_m{m}"
                v_mapping = {s: (s if s < p else 2 * p - 1 - s) for s in range(2 * p)}
                try:
                    ours = os.path.join(work, f"ours_{name}.csv")
                    comms = os.path.join(work, f"ours_{name}_comms.csv")
                    spec = ["--policy", family, "--stages", str(p), "--microbatches", str(m)]
                    po(binary, *spec, "--format", "pytorch-csv", "--out", ours)
                    po(binary, *spec, "--format", "pytorch-csv-comms", "--out", comms)
                    for path in (ours, comms):
                        mapping = torch_schedules._validate_schedule(load(path), p, 2 * p, m)
                        if mapping != v_mapping:
                            raise AssertionError(f"{path}: torch maps stages {mapping}")
                    torch_schedules._simulate_comms_compute(
                        load(comms), lambda s: v_mapping[s], 2 * p)
                    theirs = os.path.join(work, f"torch_{name}.csv")
                    dump(torch_order(family, p, m), theirs)
                    torch_schedules._validate_schedule(load(theirs), p, 2 * p, m)
                    again = os.path.join(work, f"reexported_{name}.csv")
                    po(binary, "import", theirs, "--unit-costs", "--format", "pytorch-csv",
                       "--out", again)
                    if not filecmp.cmp(again, ours, shallow=False):
                        raise AssertionError(
                            f"torch's {family} order imported and exported ({again}) differs "
                            f"from ours ({ours})")
                    checked += 1
                except Exception as error:  # report every case, then fail
                    failures.append(f"{name}: {error}")
    if len(sys.argv) > 3:
        data = os.path.join(sys.argv[3], "tests", "data")
        for fixture in sorted(os.listdir(data)):
            if not fixture.startswith("torch_") or not fixture.endswith(".csv"):
                continue
            family, p, m = fixture[len("torch_"):-len(".csv")].split("_")
            p, m = int(p[1:]), int(m[1:])
            fresh = os.path.join(work, "fixture_" + fixture)
            dump(torch_order(family, p, m), fresh)
            if not filecmp.cmp(fresh, os.path.join(data, fixture), shallow=False):
                failures.append(f"tests/data/{fixture} is not what torch writes now ({fresh})")
    for failure in failures:
        print("FAILED", failure)
    print(f"{checked} schedules checked against torch {torch.__version__}, "
          f"{len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
