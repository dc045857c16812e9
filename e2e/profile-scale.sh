#!/usr/bin/env bash
# Profiles a cold start of the operator at scale, as docs/benchmarks.md ("Where a cold
# start's CPU goes") read it: switchyard-scale-bench ROUTES 0, with kube-apiserver's own
# CPU profile over two windows (the routes rolling out, then statuses alone) and `perf`
# sampling the operator over the first. A benchmark's tool, not part of the tests.
#
#   e2e/profile-scale.sh [ROUTES (2000)] [ROLLOUT_SECONDS (18)] [STATUS_SECONDS (30)]
#
# Each window stays under 60 s: the API server's request timeout ends a profile request.
# Writes to $PROFILE_OUT (default target/profile-scale): bench.txt, apiserver-rollout.pprof,
# apiserver-status.pprof (read with `go tool pprof`), operator.perf (`perf report -i`),
# and prints the API server's CPU by what it was doing and the operator's hottest
# functions. Needs perf and Go. The release build has no frame pointers, so perf's samples
# are flat; for a call graph build the operator into a target directory of its own, e.g.
#   RUSTFLAGS="-C force-frame-pointers=yes" CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
#     CARGO_TARGET_DIR=target/frame-pointers cargo build --release -p switchyard --bin switchyard
# give target/frame-pointers/release/switchyard as $SWITCHYARD_BIN, and read the graph
# with `perf report -i OUT/operator.perf --children`.
set -euo pipefail
cd "$(dirname "$0")/.."
routes=${1:-2000}
rollout_seconds=${2:-18}
status_seconds=${3:-30}
out=${PROFILE_OUT:-target/profile-scale}
if [ "$rollout_seconds" -ge 60 ] || [ "$status_seconds" -ge 60 ]; then
  echo "each window must be under 60 s (the API server's request timeout)" >&2
  exit 1
fi
command -v perf >/dev/null || { echo "perf is needed (Debian: linux-perf)" >&2; exit 1; }
# The Go that e2e/provision.sh builds with.
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[ -x "$GO" ] || { echo "Go is needed (go tool pprof reads the API server's profiles): set GO" >&2; exit 1; }

e2e/provision.sh
# shellcheck source=/dev/null
source "${SWITCHYARD_E2E_CACHE:-$HOME/.cache/switchyard-e2e}/bin/env.sh"
cargo build --release --quiet -p switchyard --bin switchyard -p switchyard-e2e --bin switchyard-scale-bench
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
export SWITCHYARD_BIN=${SWITCHYARD_BIN:-$target_dir/release/switchyard}
mkdir -p "$out"
rm -f "$out"/*.pprof "$out"/operator.perf "$out"/perf.log

# profile BENCH_PID: waits for the bench's operator (its child, whose command line names
# the Envoy Service), then reads the API server through the operator's own kubeconfig.
profile() {
  local bench=$1 pid="" waited=0 kubeconfig running=()
  trap 'kill "${running[@]}" 2>/dev/null; exit 1' TERM
  until pid=$(pgrep -P "$bench" -f -- "operator --envoy-service"); do
    sleep 0.2
    waited=$((waited + 1))
    if [ "$waited" -gt 9000 ] || ! kill -0 "$bench" 2>/dev/null; then
      echo "profile: the bench started no operator" >&2
      return 1
    fi
  done
  kubeconfig=$(tr '\0' '\n' <"/proc/$pid/environ" | sed -n 's/^KUBECONFIG=//p')
  sleep 1
  perf record -F 499 -g -p "$pid" -o "$out/operator.perf" -- sleep "$rollout_seconds" \
    >"$out/perf.log" 2>&1 &
  local perf_pid=$!
  running=("$perf_pid")
  local window seconds
  for window in rollout status; do
    seconds=$rollout_seconds
    [ "$window" = status ] && seconds=$status_seconds
    "$SWITCHYARD_E2E_KUBECTL" --kubeconfig "$kubeconfig" get --raw \
      "/debug/pprof/profile?seconds=$seconds" >"$out/apiserver-$window.pprof" &
    running=("$perf_pid" "$!")
    wait "$!" || echo "profile: the API server's $window profile was cut short (did the bench end first? shorter windows)" >&2
  done
  wait "$perf_pid" || { echo "profile: perf failed:" >&2; cat "$out/perf.log" >&2; }
}

"$target_dir/release/switchyard-scale-bench" "$routes" 0 > >(tee "$out/bench.txt") &
bench=$!
profile "$bench" &
profiler=$!
# A bench that fails leaves no profiler running.
trap 'kill "$profiler" 2>/dev/null || true' EXIT
wait "$bench"
wait "$profiler" || true

# shares PROFILE: the API server's CPU by what it was doing, inclusive (the status writes
# are part of the patches; the rest, not broken down here, is mostly the handler chain
# every request goes through, JSON, and the garbage collector's assists).
shares() {
  local what focus ignore share
  [ -s "$1" ] || { echo "  (no profile in $1)"; return 0; }
  "$GO" tool pprof -top -nodecount=1 "$1" 2>/dev/null | grep '^Duration' || true
  while IFS=';' read -r what focus ignore; do
    share=$("$GO" tool pprof -top -cum -focus="$focus" ${ignore:+-ignore="$ignore"} -nodecount=1 "$1" 2>/dev/null |
      tail -1 | awk '{print ($5 ~ /^[0-9.]+%$/) ? $5 : "none"}')
    printf '  %-52s %s\n' "$what" "$share"
  done <<'PATTERNS'
status writes (part of the patches);StatusREST;
custom resource creates (ProxyConfigs);crdHandler.*CreateResource;
patches in all;patchResource;
server-side apply's field manager;fieldmanager;
custom resource reads;crdHandler.*GetResource;
custom resource deletes;crdHandler.*DeleteResource;
custom resource lists (not watches);crdHandler.*ListResource;serveWatch|WatchServer
built-in creates (Events);restfulCreateResource;
watches served;serveWatch|WatchServer;
Go's garbage collector (its background workers);gcBgMarkWorker;
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
if [ -s "$out/operator.perf" ]; then
  perf report -i "$out/operator.perf" --no-children --sort dso,sym -g none --percent-limit 1 2>/dev/null |
    grep -v '^#' | grep -v '^$' | head -25 || true
else
  echo "  (no perf samples: see $out/perf.log)"
fi
