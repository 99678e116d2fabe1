# Sourced on the GPU machine (repo root): unpacks $CARRY/bin.tar.xz (default
# .devcarry, made by tools/gpu/pack.sh) into $CARRY/x, sets D to that folder
# and LD_LIBRARY_PATH to its libraries plus the CUDA runtime and cuBLAS.
C=${CARRY:-.devcarry}
D=$C/x
mkdir -p "$D" && tar -C "$D" -xJf "$C/bin.tar.xz" || { echo "unpack of $C/bin.tar.xz failed"; return 1 2>/dev/null || exit 1; }
libs=""
for f in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
  p=$(find /usr/local /usr/lib /opt -name "$f" 2>/dev/null | head -1)
  [ -n "$p" ] && libs="$libs:$(dirname "$p")"
done
export LD_LIBRARY_PATH="$PWD/$D/lib$libs:${LD_LIBRARY_PATH:-}"
