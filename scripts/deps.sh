#!/usr/bin/env bash
# Installs the Debian packages glm53 builds and tests with (idempotent: does
# nothing when they are all present). Needs root or sudo.
set -euo pipefail
PKGS="build-essential cmake pkg-config libcjson-dev libpcre2-dev libmicrohttpd-dev libxxhash-dev libutf8proc-dev python3"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
# Node.js may come from another repository (e.g. NodeSource, which bundles
# npm): only install Debian's when the commands are missing.
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
[ -z "$missing" ] && exit 0
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
echo "installing:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
