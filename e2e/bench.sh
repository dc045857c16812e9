#!/usr/bin/env bash
# The benchmarks: translation, push → ACK on a real Envoy, time to Ready of rollouts on a
# real kube-apiserver with three real Envoys, and the operator at scale on a real
# kube-apiserver (SWITCHYARD_SCALE_ROUTES routes, default 10000; 0 skips it: about 15
# minutes at 10k on 2 cores). Prints tables (see docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
e2e/provision.sh
cargo build --release --quiet -p switchyard --bin switchyard -p switchyard-e2e --bin switchyard-bench --bin switchyard-rollout-bench --bin switchyard-scale-bench
target/release/switchyard-bench "$@"
echo
target/release/switchyard-rollout-bench 30
scale_routes=${SWITCHYARD_SCALE_ROUTES:-10000}
if [ "$scale_routes" != 0 ]; then
  echo
  target/release/switchyard-scale-bench "$scale_routes" "${SWITCHYARD_SCALE_RESTART_ROUTES:-2000}"
fi
