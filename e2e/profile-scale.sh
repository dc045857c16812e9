#!/usr/bin/env bash
# Profiles a cold start of the operator at scale, as docs/benchmarks.md ("Where a cold
# start's CPU goes") read it: switchyard-scale-bench ROUTES 0, with kube-apiserver's own
# CPU profile over two windows (the routes rolling out, then statuses alone) and `perf`
# sampling the operator over the first. A benchmark's tool, not part of the tests.
#
#   e2e/profile-scale.sh [ROUTES (2000)] [ROLLOUT_SECONDS (18)] [STATUS_SECONDS (30)]
#
# Writes to $PROFILE_OUT (default target/profile-scale): bench.txt, apiserver-rollout.pprof,
# apiserver-status.pprof (read with `go tool pprof`), operator.perf (`perf report -i`),
# and prints the top of each. Needs perf. The release build has no frame pointers, so
# perf's samples are flat; for a call graph build the operator with
# RUSTFLAGS="-C force-frame-pointers=yes" CARGO_PROFILE_RELEASE_DEBUG=line-tables-only
# and give it as $SWITCHYARD_BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
routes=${1:-2000}
rollout_seconds=${2:-18}
status_seconds=${3:-30}
out=${PROFILE_OUT:-target/profile-scale}
command -v perf >/dev/null || { echo "perf is needed (Debian: linux-perf)" >&2; exit 1; }
command -v go >/dev/null || { echo "go is needed (go tool pprof reads the API server's profiles)" >&2; exit 1; }

e2e/provision.sh
# shellcheck source=/dev/null
source "${SWITCHYARD_E2E_CACHE:-$HOME/.cache/switchyard-e2e}/bin/env.sh"
cargo build --release --quiet -p switchyard --bin switchyard -p switchyard-e2e --bin switchyard-scale-bench
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
export SWITCHYARD_BIN=${SWITCHYARD_BIN:-$target_dir/release/switchyard}
mkdir -p "$out"
rm -f "$out"/*.pprof "$out"/operator.perf

# The profilers wait for the bench's operator (its command line names the Envoy Service),
# then read the API server through the operator's own kubeconfig.
profile() {
  local pid="" waited=0 kubeconfig
  until pid=$(pgrep -f -n -- "operator --envoy-service"); do
    sleep 0.2
    waited=$((waited + 1))
    if [ "$waited" -gt 9000 ]; then
      echo "profile: no operator started within 30 minutes" >&2
      return 1
    fi
  done
  kubeconfig=$(tr '\0' '\n' <"/proc/$pid/environ" | sed -n 's/^KUBECONFIG=//p')
  sleep 1
  perf record -F 499 -g -p "$pid" -o "$out/operator.perf" -- sleep "$rollout_seconds" \
    >"$out/perf.log" 2>&1 &
  "$SWITCHYARD_E2E_KUBECTL" --kubeconfig "$kubeconfig" get --raw \
    "/debug/pprof/profile?seconds=$rollout_seconds" >"$out/apiserver-rollout.pprof"
  "$SWITCHYARD_E2E_KUBECTL" --kubeconfig "$kubeconfig" get --raw \
    "/debug/pprof/profile?seconds=$status_seconds" >"$out/apiserver-status.pprof"
  wait
}
profile &
profiler=$!
# A bench that fails before its operator starts leaves nothing to wait for.
trap 'kill "$profiler" 2>/dev/null || true' EXIT
"$target_dir/release/switchyard-scale-bench" "$routes" 0 | tee "$out/bench.txt"
wait "$profiler" || echo "profile: a profile was cut short (did the bench end first? shorter windows)" >&2

# shares PROFILE: the API server's CPU by what it was doing (inclusive; the rest of it is
# the handler chain every request goes through, and JSON).
shares() {
  local what pattern
  go tool pprof -top -nodecount=1 "$1" 2>/dev/null | grep '^Duration'
  while IFS='|' read -r what pattern; do
    printf '  %-52s %s\n' "$what" "$(go tool pprof -top -cum -focus="$pattern" -nodecount=1 "$1" 2>/dev/null |
      tail -1 | awk '{print ($5 ~ /^[0-9.]+%$/) ? $5 : "none"}')"
  done <<'PATTERNS'
status writes|StatusREST
custom resource creates (ProxyConfigs)|crdHandler.*CreateResource
patches in all (statuses, batches)|patchResource
server-side apply's field manager|fieldmanager
custom resource reads|crdHandler.*GetResource
custom resource deletes|crdHandler.*DeleteResource
custom resource lists|crdHandler.*ListResource
built-in creates (Events)|restfulCreateResource
watches served|serveWatch|WatchServer
Go's garbage collector|gcBgMarkWorker
PATTERNS
}
echo
echo "kube-apiserver, routes rolling out ($out/apiserver-rollout.pprof):"
shares "$out/apiserver-rollout.pprof"
echo
echo "kube-apiserver, statuses alone ($out/apiserver-status.pprof):"
shares "$out/apiserver-status.pprof"
echo
echo "operator, routes rolling out ($out/operator.perf):"
perf report -i "$out/operator.perf" --no-children --sort dso,sym -g none --percent-limit 1 2>/dev/null |
  grep -v '^#' | grep -v '^$' | head -25
