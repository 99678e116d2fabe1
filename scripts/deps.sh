#!/usr/bin/env bash
# Installs the Debian packages glm53 builds and tests with (idempotent: does
# nothing when they are all present). Needs root or sudo.
set -euo pipefail
PKGS="build-essential cmake pkg-config libcjson-dev libpcre2-dev libmicrohttpd-dev libxxhash-dev libutf8proc-dev nodejs npm python3"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
[ -z "$missing" ] && exit 0
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
echo "installing:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
