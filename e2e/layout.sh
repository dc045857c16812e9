#!/usr/bin/env bash
# The dependency rules of docs/architecture.md, checked on the source: no front-end
# imports another, the rollout engine and the shared Kubernetes parts import no
# front-end. (That the core crate knows no Kubernetes is checked on its dependency tree.)
set -euo pipefail
cd "$(dirname "$0")/.."

front_ends=(traffic_route gateway standalone)
failed=0

# forbid DIR MODULE...: DIR's Rust files must not name crate::MODULE.
forbid() {
  local dir=$1
  shift
  local module
  for module in "$@"; do
    if grep -rnE "crate::${module}\b|super::super::${module}\b" "src/${dir}" --include='*.rs'; then
      echo "src/${dir} uses crate::${module} (above): see docs/architecture.md" >&2
      failed=1
    fi
  done
}

for front_end in "${front_ends[@]}"; do
  others=()
  for other in "${front_ends[@]}"; do
    [ "$other" = "$front_end" ] || others+=("$other")
  done
  forbid "$front_end" "${others[@]}"
done
forbid rollout "${front_ends[@]}"
forbid k8s "${front_ends[@]}" rollout
exit "$failed"
