#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for a bounded time each, starting from the committed
# corpus, and prints a table: executions, time, corpus before and new inputs found. A
# crash fails the run; its input is kept under fuzz/artifacts/<target>/ and the command to
# replay it is printed. New inputs go to a scratch directory, never into the checkout
# (fuzz/README.md says how to fold them into the corpus).
#
# Built by cargo-fuzz (e2e/provision.sh --only cargo-fuzz) on stable Rust with
# --sanitizer none and debug assertions, into a target directory in the e2e cache that
# outlives the checkout: the first build takes about 10 minutes on 2 cores.
#
#   SWITCHYARD_FUZZ_SECONDS   seconds per target (default 45)
#   SWITCHYARD_FUZZ_TARGETS   the targets to run (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${SWITCHYARD_E2E_CACHE:-$HOME/.cache/switchyard-e2e}"
SECONDS_EACH="${SWITCHYARD_FUZZ_SECONDS:-45}"
TARGET_DIR="$CACHE/fuzz-target"
# Cached after the first run; a cargo subcommand's binary takes its name first.
e2e/provision.sh --only cargo-fuzz >/dev/null
FUZZ=("$CACHE/bin/cargo-fuzz" fuzz)
BUILD_FLAGS=(--sanitizer none --debug-assertions --target-dir "$TARGET_DIR")

read -r -a targets <<<"${SWITCHYARD_FUZZ_TARGETS:-$("${FUZZ[@]}" list | tr '\n' ' ')}"
echo "fuzz: building ${targets[*]}"
"${FUZZ[@]}" build "${BUILD_FLAGS[@]}" >/dev/null

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
rows=()
failed=0
for target in "${targets[@]}"; do
	corpus="fuzz/corpus/$target"
	found="$scratch/$target"
	mkdir -p "$found" "fuzz/artifacts/$target"
	before=$(find "$corpus" -type f | wc -l)
	log="$scratch/$target.log"
	status=0
	"${FUZZ[@]}" run "${BUILD_FLAGS[@]}" "$target" "$found" "$corpus" -- \
		-max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 \
		-artifact_prefix="fuzz/artifacts/$target/" >"$log" 2>&1 || status=$?
	runs=$(grep -oE '^Done [0-9]+ runs in [0-9]+ second' "$log" | awk '{print $2, $5}' || true)
	new=$(find "$found" -type f | wc -l)
	if ((status != 0)); then
		failed=1
		echo "fuzz: $target FAILED (exit $status); its log:" >&2
		grep -vE '^(INFO|#[0-9]+)' "$log" | tail -60 >&2
		rows+=("$(printf '%-16s %12s %8s %10s %8s %6s  %s' "$target" - - - "$before" "$new" FAILED)")
		continue
	fi
	read -r n s <<<"${runs:-0 1}"
	rows+=("$(printf '%-16s %12s %8s %10s %8s %6s  %s' "$target" "$n" "${s}s" "$((n / (s > 0 ? s : 1)))" "$before" "$new" ok)")
done
printf '\n%-16s %12s %8s %10s %8s %6s  %s\n' target executions time "per sec" corpus new result
printf '%s\n' "${rows[@]}"
exit "$failed"
