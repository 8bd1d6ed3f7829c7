#!/usr/bin/env bash
# System packages the tests need beyond Python: Debian's prometheus (prometheus and promtool),
# for `promtool check rules` on `vllm-doctor alerts` (tests/render/test_alerts.py). Quiet when
# already installed; .ci/run calls it before the tests.
set -euo pipefail
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
