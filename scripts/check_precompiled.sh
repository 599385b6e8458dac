#!/bin/sh
# Checks precompiled NIF archives (mix exla.precompile) before a release:
#   - no glibc symbol version above the floor (default 2.28);
#   - no needed library beyond those the CPU PJRT plugin itself needs;
#   - the ELF machine matches the archive's target;
#   - the library loads and its nif_init answers (natively, or under
#     qemu-user with the target's libraries for a foreign architecture:
#     Debian's qemu-user and libc6-<arch>-cross, libstdc++6-<arch>-cross).
# Needs readelf and zig (pip install ziglang) to build the loader.
#
#   scripts/check_precompiled.sh target/precompiled [2.28]
set -eu
dir=${1:-target/precompiled}
floor=${2:-2.28}
allowed="libc.so.6 libm.so.6 libdl.so.2 librt.so.1 libpthread.so.0 libstdc++.so.6 libgcc_s.so.1 ld-linux-x86-64.so.2 ld-linux-aarch64.so.1"
here=$(dirname "$0")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0

for archive in "$dir"/libexla-*-linux-gnu.so.tar.gz; do
  name=$(basename "$archive")
  arch=${name%%-linux-gnu.so.tar.gz}
  arch=${arch##*-}
  so="$work/$arch.so"
  tar -xzOf "$archive" libexla.so > "$so"
  echo "== $name"

  machine=$(readelf -h "$so" | sed -n 's/ *Machine: *//p')
  case "$arch:$machine" in
    x86_64:*X86-64*|aarch64:AArch64) echo "machine: $machine" ;;
    *) echo "FAIL: machine $machine for $arch"; status=1 ;;
  esac

  needed=$(readelf -d "$so" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p')
  echo "needed: $(echo $needed)"
  for lib in $needed; do
    case " $allowed " in *" $lib "*) ;; *) echo "FAIL: needs $lib"; status=1 ;; esac
  done

  versions=$(readelf -V "$so" | grep -o 'GLIBC_[0-9.]*\|GLIBCXX_[0-9.]*\|CXXABI_[0-9.]*\|GCC_[0-9.]*' | sort -Vu)
  echo "versions: $(echo $versions)"
  newest=$(echo "$versions" | sed -n 's/^GLIBC_//p' | sort -V | tail -1)
  if [ "$(printf '%s\n%s\n' "$newest" "$floor" | sort -V | tail -1)" != "$floor" ]; then
    echo "FAIL: needs GLIBC_$newest, above $floor"; status=1
  fi

  # A loader exporting stubs of the enif_* functions rustler looks up.
  strings "$so" | grep -E '^enif_[a-z_0-9]+$' | sort -u | sed 's/.*/void &(void) {}/' > "$work/stubs.c"
  python3 -m ziglang cc -target "$arch-linux-gnu.$floor" -rdynamic -o "$work/load-$arch" \
    "$here/nif_load_check.c" "$work/stubs.c"
  if [ "$arch" = "$(uname -m)" ]; then
    "$work/load-$arch" "$so" || status=1
  else
    qemu-"$arch" -L "/usr/$arch-linux-gnu" "$work/load-$arch" "$so" || status=1
  fi
done
exit $status
