#!/usr/bin/env bash
# binaries: c_api_stage_test c_api_rank_test
# libraries: po_c_api
# seconds: 90
# Issue 14, C ABI: po_pipeline on the CUDA backend (a build with -DPO_WITH_CUDA=ON). First the CPU
# suite of c_api_stage_test on the device's CPU, then `--cuda`: 4 stages of 1F1B po-f on one GPU,
# callbacks that compute nothing (C has no kernels here) but check their buffers and get a
# nonzero stream; every stash entry still goes D2H and back, and the measured stash peaks and
# offloaded bytes must equal the predictions. rc=77 means skipped (the message says why: a
# library without CUDA, or no GPU). Then the same from Python (LocalPipeline, backend="cuda"),
# and po_stage over NCCL under mpirun (c_api_rank_test --nccl).
set -u
export PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$PWD/python
export PIPEOFFLOAD_LIBRARY=$BUILD/lib/libpipeoffload_c.so
export LD_LIBRARY_PATH=$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
timeout 60 "$BUILD/tests/c_api/c_api_stage_test" 2>&1 | tee "$LOG/cpu.log" | tail -5
echo "cpu rc=${PIPESTATUS[0]}"
timeout 60 "$BUILD/tests/c_api/c_api_stage_test" --cuda 2>&1 | tee "$LOG/cuda.log" | tail -5
echo "cuda rc=${PIPESTATUS[0]}"
timeout 60 python3 - <<'PY' 2>&1 | tee "$LOG/python_cuda.log" | tail -8
import pipeoffload as po

class Stage:  # computes nothing: the run checks buffers, streams and the runtime's bytes
    boundary_bytes = 1 << 20
    def __init__(self): self.streams = set()
    def saved_bytes(self, chunk, split_backward): return 4 << 20
    def forward(self, call):
        assert call.saved is not None
        self.streams.add(call.stream)
    def backward(self, call): self.streams.add(call.stream)

stages = [Stage() for _ in range(4)]
with po.LocalPipeline(stages, backend="cuda", stages=4, microbatches=8, offload="po-f") as p:
    stats = p.run(2)
    predicted = p.schedule.predictions.stages
for d, stage in enumerate(stages):
    s = stats[1][d]
    print(f"stage {d}: stash peak {s.stash_high_water_bytes} (predicted {predicted[d].peak_bytes}),"
          f" offloaded {s.offloaded_bytes} (predicted {predicted[d].offloaded_bytes}),"
          f" streams {sorted(hex(x) for x in stage.streams)}")
    assert s.stash_high_water_bytes == predicted[d].peak_bytes
    assert s.offloaded_bytes == predicted[d].offloaded_bytes
    assert len(stage.streams) == 1 and 0 not in stage.streams
print("python cuda: OK")
PY
echo "python rc=${PIPESTATUS[0]}"
# po_stage over NCCL (one rank per GPU; one rank on a one-GPU machine): open, run, the stash
# peak and offloaded bytes against the predictions.
timeout 60 mpirun -np 1 "$BUILD/tests/c_api/c_api_rank_test" --nccl 2>&1 | tee "$LOG/rank_nccl.log" | tail -3
echo "rank nccl rc=${PIPESTATUS[0]}"
