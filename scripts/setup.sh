#!/usr/bin/env bash
# Installs the Debian 12 packages pipeoffload builds and tests with. Idempotent: installs only
# what is missing, so it is cheap to run before every build. CUDA (nvcc, NCCL) is optional and
# comes from /usr/local/cuda when present; it is not installed here.
set -euo pipefail

# liburing-dev: io_uring for the NVMe tier of layer sliding (lib/slide/nvme_uring.cc), linked
# from its static archive. python3, python3-pytest: the Python package over the C ABI
# (python/pipeoffload) and its tests (tests/python).
packages=(build-essential cmake ninja-build libabsl-dev catch2 nlohmann-json3-dev
          libopenmpi-dev openmpi-bin liburing-dev python3 python3-pytest)
missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "setup: all packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
