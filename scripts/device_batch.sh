#!/usr/bin/env bash
# Batches several GPU jobs into one device run (the GPU machine's time is scarce and every cold
# start costs a minute). A job is a bash script whose second line names the executables it needs:
#     #!/usr/bin/env bash
#     # binaries: gpu_tests copy_bench
# and which reads $BUILD (the packed build, paths as in the build dir) and writes its outputs to
# $LOG (a folder of its own). A job may also name shared libraries by CMake target or file name:
#     # libraries: po_c_api
# (po_c_api is libpipeoffload_c.so); --pack copies each into DEST/lib with every dependency ldd
# resolves outside the system's C and C++ runtime (the libabsl_* .so files the GPU machine lacks),
# and the run side puts DEST/lib on LD_LIBRARY_PATH.
#
#   scripts/device_batch.sh --pack BUILD_DIR DEST JOB.sh [JOB.sh ...]     (on the build machine)
#       copies CMakeCache.txt, every CTestTestfile.cmake, the named executables (stripped of debug
#       info), the named libraries with their dependencies (DEST/lib) and the job scripts into
#       DEST; carry DEST to the GPU machine.
#   scripts/device_batch.sh DEST [--budget SECONDS]                       (on the GPU machine)
#       runs every job in DEST/jobs in name order, each under `timeout` (default 120 s, or the
#       job's "# seconds: N" line; with --budget, no more than what is left of SECONDS, and a
#       job with less than 10 s left is skipped, so the results are packed before a device
#       call's own limit), with stdout+stderr in $LOG/run.log, then packs every job's
#       folder into $OUT/results.tar.gz (the device tool returns at most 8 files) and prints a
#       one-line summary per job.
# Exit status: 0 when every job exited 0.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# The C and C++ runtime every machine has: never packed (a copy could clash with its loader).
system_library='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so'
# What the GPU machine has its own of: never packed either. Its Open MPI must match its mpirun
# (a copy of Debian's libmpi would talk to another runtime), and NCCL and CUDA are installed
# there.
device_library='^(libmpi|libopen-(rte|pal)|libpmix|libhwloc|libevent|libz|libudev|libnccl|libcud|libcublas)'

# pack_library BUILD_DIR LIB_DIR NAME: NAME is a CMake target (its file from lib<NAME>.so in the
# build, or po_c_api -> libpipeoffload_c.so) or a file name; copies it (stripped, under its
# soname too) and its non-system dependencies into LIB_DIR.
pack_library() {
  local src=$1 lib_dir=$2 name=$3 file
  case "$name" in
    po_c_api) name=libpipeoffload_c.so ;;
    lib*.so*) ;;
    *) name=lib$name.so ;;
  esac
  file=$(cd "$src" && find . -name "$name" -not -path '*/CMakeFiles/*' | head -1)
  [[ -n "$file" ]] || return 1
  mkdir -p "$lib_dir"
  local real
  real=$(readlink -f "$src/$file")
  strip --strip-debug -o "$lib_dir/$(basename "$real")" "$real"
  local soname
  soname=$(objdump -p "$real" 2>/dev/null | awk '/SONAME/ {print $2}')
  # Copies, not symlinks: the device tool's transfers may not keep links.
  for link in "$name" $soname; do
    [[ "$link" == "$(basename "$real")" ]] || cp "$lib_dir/$(basename "$real")" "$lib_dir/$link"
  done
  ldd "$real" | awk '/=> \// {print $1, $3}' | while read -r dep path; do
    [[ "$dep" =~ $system_library || "$dep" =~ $device_library ]] && continue
    cp -L "$path" "$lib_dir/$dep"
  done
}

if [[ "${1:-}" == "--pack" ]]; then
  if [[ $# -lt 4 || ! -f "$2/CMakeCache.txt" ]]; then
    echo "usage: $0 --pack BUILD_DIR DEST JOB.sh [JOB.sh ...] (BUILD_DIR must hold a CMake build)" >&2
    exit 2
  fi
  src=$(cd "$2" && pwd)
  rm -rf "$3"
  mkdir -p "$3/jobs"
  dest=$(cd "$3" && pwd)
  shift 3
  cp "$src/CMakeCache.txt" "$dest/"
  while IFS= read -r file; do
    mkdir -p "$dest/$(dirname "$file")"
    cp "$src/$file" "$dest/$file"
  done < <(cd "$src" && find . -name CTestTestfile.cmake)
  for job in "$@"; do
    cp "$job" "$dest/jobs/"
    read -r -a names < <(sed -n 's/^# binaries://p' "$job" | head -1)
    for name in "${names[@]}"; do
      found=0
      while IFS= read -r file; do
        mkdir -p "$dest/$(dirname "$file")"
        strip --strip-debug -o "$dest/$file" "$src/$file"
        found=1
      done < <(cd "$src" && find . -name "$name" -type f -perm -u+x -not -path '*/CMakeFiles/*')
      [[ $found -eq 1 ]] || echo "device_batch: $(basename "$job"): no executable '$name' in $src" >&2
    done
  done
  for job in "$@"; do
    read -r -a names < <(sed -n 's/^# libraries://p' "$job" | head -1)
    for name in "${names[@]}"; do
      pack_library "$src" "$dest/lib" "$name" || echo "device_batch: $(basename "$job"): no library '$name' in $src" >&2
    done
  done
  du -sh "$dest"
  exit 0
fi

budget=0
if [[ $# -eq 3 && "$2" == "--budget" && "$3" =~ ^[1-9][0-9]*$ ]]; then
  budget=$3
elif [[ $# -ne 1 ]]; then
  echo "usage: $0 DEST [--budget SECONDS] (DEST: a folder made by --pack)" >&2
  exit 2
fi
if [[ ! -d "$1/jobs" ]]; then
  echo "usage: $0 DEST [--budget SECONDS] (DEST: a folder made by --pack; $1/jobs is missing)" >&2
  exit 2
fi
pack=$(cd "$1" && pwd)
out=${OUT:-$PWD/device-logs}
mkdir -p "$out"
results=$(mktemp -d)
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Libraries packed for the jobs (# libraries:) come first on the loader's path.
[[ -d "$pack/lib" ]] && export LD_LIBRARY_PATH="$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# cuBLAS is linked dynamically: put it on the loader's path for every job.
source "$root/scripts/find_cublas.sh"
po_find_cublas || echo "device_batch: no libcublas.so.13 found; jobs may fail to load" >&2

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  nproc
} >"$results/machine.txt"

status=0
batch_start=$(date +%s)
for job in "$pack"/jobs/*.sh; do
  name=$(basename "$job" .sh)
  limit=$(sed -n 's/^# seconds: *\([0-9]*\).*/\1/p' "$job" | head -1)
  limit=${limit:-120}
  if ((budget > 0)); then
    left=$((budget - ($(date +%s) - batch_start)))
    if ((left < 10)); then
      echo "$name: skipped (${left} s left of the --budget of $budget s)" |
        tee -a "$results/summary.txt"
      status=1
      continue
    fi
    ((limit > left)) && limit=$left
  fi
  mkdir -p "$results/$name"
  start=$(date +%s)
  (cd "$root" && BUILD="$pack" LOG="$results/$name" timeout -k 10 "$limit" bash "$job") \
    >"$results/$name/run.log" 2>&1
  rc=$?
  line="$name: exit $rc after $(( $(date +%s) - start )) s (limit $limit s)"
  echo "$line" | tee -a "$results/summary.txt"
  [[ $rc -eq 0 ]] || status=1
done
tar -C "$results" -czf "$out/results.tar.gz" .
cp "$results/summary.txt" "$out/summary.txt"
exit $status
