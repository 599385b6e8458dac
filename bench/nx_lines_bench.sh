#!/usr/bin/env bash
# The same three benchmarks (bench/nx_lines_bench.exs: the MLP step's first
# call, a cached MLP step, a tiny cached call) on Nx 0.7.2 and on Nx 0.13.1,
# both with the Elixir 1.18 toolchain, in one run: the lines alternate in
# every round, each measurement in a fresh process, so both see the same
# machine. Prints the medians and the ratio of Nx 0.13.1 to Nx 0.7.2.
#
#     bench/nx_lines_bench.sh [rounds]    (default 5; from the project root)
#
# Uses ../shared/deps for Nx and ../shared/toolchains for Elixir 1.18, and
# the test environment's builds of .ci/run (_build_118_nx07, _build_118_nx13):
# the test environment's NIF (with the fault-injection feature, which adds
# nothing to these paths) is the one in priv/, so no other is built.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
shared="$(cd .. && pwd)/shared"
eval "$("$shared/toolchains/activate")"

declare -A nx=([nx07]="$shared/deps/nx" [nx13]="$shared/deps/nx-0.13/nx")
out=$(mktemp)
trap 'rm -f "$out"' EXIT

for line in nx07 nx13; do
  NX_PATH=${nx[$line]} MIX_BUILD_ROOT=_build_118_$line MIX_ENV=test mix compile >/dev/null
done

for _ in $(seq "$rounds"); do
  for line in nx07 nx13; do
    NX_PATH=${nx[$line]} MIX_BUILD_ROOT=_build_118_$line MIX_ENV=test \
      mix run bench/nx_lines_bench.exs 2>/dev/null | tail -1 | sed "s/^/$line /" >>"$out"
  done
done

awk -v rounds="$rounds" '
  function median(a, n,   i, j, t) {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return a[int((n + 1) / 2)]
  }
  { n[$1]++; version[$1] = $2; first[$1, n[$1]] = $3; mlp[$1, n[$1]] = $4; tiny[$1, n[$1]] = $5 }
  END {
    for (l in n) {
      for (i = 1; i <= n[l]; i++) { f[i] = first[l, i]; m[i] = mlp[l, i]; t[i] = tiny[l, i] }
      F[l] = median(f, n[l]); M[l] = median(m, n[l]); T[l] = median(t, n[l])
    }
    printf "| Nx | first call (ms) | MLP step (ms) | tiny cached call (µs) |\n|---|---|---|---|\n"
    printf "| %s | %.1f | %.3f | %.2f |\n", version["nx07"], F["nx07"], M["nx07"], T["nx07"]
    printf "| %s | %.1f | %.3f | %.2f |\n", version["nx13"], F["nx13"], M["nx13"], T["nx13"]
    printf "| 0.13.1 / 0.7.2 | %.2f | %.2f | %.2f |\n", F["nx13"] / F["nx07"], M["nx13"] / M["nx07"], T["nx13"] / T["nx07"]
    printf "\n(medians of %d rounds)\n", rounds
  }' "$out"
