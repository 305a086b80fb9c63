# Sourced by the device scripts (bash). Our CUDA binaries link cuBLAS dynamically (the static one
# needs culibos and would exceed what the device tool carries), so on a machine whose loader does
# not know where CUDA's libraries are, look for libcublas.so.13 under /usr/local/cuda*/ and in
# python3's nvidia-cublas package, and put the first hit on LD_LIBRARY_PATH.
#   po_find_cublas [BINARY]   with BINARY: only when `ldd BINARY` reports a library not found
po_find_cublas() {
  if [[ -n "${1:-}" ]] && ! ldd "$1" 2>/dev/null | grep -q "not found"; then
    return 0
  fi
  local dir
  for dir in /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 /usr/local/cuda/targets/*/lib \
             $(python3 -c 'import nvidia.cublas, os; print(os.path.join(nvidia.cublas.__path__[0], "lib"))' 2>/dev/null); do
    if [[ -e "$dir/libcublas.so.13" ]]; then
      export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      return 0
    fi
  done
  return 1
}
