#!/usr/bin/env bash
# The system packages the tests need beside Python's: Debian's chromium, for the screenshot test
# of the HTML report (tests/render/test_chromium.py; under CI=true it fails without it). Quiet
# when it is already there; .ci/run calls this before the tests.
set -euo pipefail
command -v chromium >/dev/null && exit 0
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
