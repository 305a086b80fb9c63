"""pipeoffload.RankStage under mpirun (one stage per rank; ctest python_rank_stage): the toy of
test_stage.py as this rank's stage of a group-interleaved po-f pipeline, checked bitwise
against the straight-line computation on this rank's virtual stages, its stash peak and bytes
against the compiler's predictions. The library starts MPI here and finalizes it at close().

usage: mpirun -np P python3 rank_stage_check.py     (exit 0: every check held)"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pipeoffload as po  # noqa: E402
from test_stage import Toy, reference  # noqa: E402


def main():
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    p = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    v, m = 2, 2 * p
    results = {}
    seen = []
    with po.RankStage(Toy(rank, p, v, results), transport="mpi", family="group-interleaved",
                      offload="po-f", stages=p, microbatches=m, chunks=v) as stage:
        assert (stage.rank, stage.num_stages) == (rank, p), (stage.rank, stage.num_stages)
        stats = stage.run(iterations=2, on_iteration=seen.append)
        predicted = stage.schedule.predictions.stages[rank]
    assert seen == [0, 1], seen
    expected = reference(p * v, m)
    mine = {key: value for key, value in expected.items()
            if (key[0] == "weight_grad" and key[1] % p == rank)
            or (key[0] == "input_grad" and rank == 0)}
    assert results == mine, f"rank {rank}: gradients differ from the straight line"
    for iteration in stats:
        assert iteration.stage == rank
        assert iteration.stash_high_water_bytes == predicted.peak_bytes
        assert iteration.offloaded_bytes == predicted.offloaded_bytes
        assert iteration.reloaded_bytes == predicted.offloaded_bytes
    if rank == 0:
        assert predicted.offloaded_bytes > 0, "po-f offloads nothing on stage 0"
    print(f"rank_stage_check: rank {rank} of {p}: bitwise equal, stash peak "
          f"{stats[1].stash_high_water_bytes} B as predicted, {predicted.offloaded_bytes} B "
          "offloaded")


if __name__ == "__main__":
    main()
