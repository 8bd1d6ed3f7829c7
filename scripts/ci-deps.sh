#!/usr/bin/env bash
# The tests' dependencies outside Python, installed when missing and silent when present:
#   tmux        the terminal captures of tests/render/test_screen.py
#   prometheus  prometheus and promtool: `promtool check rules` on `vllm-doctor alerts`, and the
#               real Prometheus that `explain --prometheus` is tested against
#   chromium    the screenshot test of the HTML report (tests/render/test_chromium.py)
#   ripgrep, time  what bench/serving.py measures against (rg) and with (GNU time's peak RSS)
# Under CI=true the tests that need them fail without them; elsewhere they are skipped.
# Needs root or passwordless sudo to install. .ci/run calls it before the tests.
set -euo pipefail
need=(tmux:tmux promtool:prometheus prometheus:prometheus chromium:chromium rg:ripgrep /usr/bin/time:time)
missing=()
for pair in "${need[@]}"; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair##*:}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" -eq 0 ]; then sudo=(); elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo=(sudo -n); else
  echo "ci-deps: cannot install ${missing[*]} (not root, no passwordless sudo): install it by hand" >&2
  exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
  echo "ci-deps: installing ${missing[*]}" >&2
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "ci-deps: no apt-get here: install ${missing[*]} by hand" >&2
fi
