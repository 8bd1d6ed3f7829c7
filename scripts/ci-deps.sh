#!/usr/bin/env bash
# The tests' dependencies outside Python, installed when missing and silent when present:
# tmux, for the terminal captures of tests/render/test_screen.py (under CI=true they fail
# without it; elsewhere they are skipped). Needs root or passwordless sudo to install.
set -euo pipefail
missing=()
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then sudo=(); elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo=(sudo -n); else
  echo "ci-deps: cannot install ${missing[*]} (not root, no passwordless sudo): install it by hand" >&2
  exit 0
fi
if command -v apt-get >/dev/null 2>&1; then
  echo "ci-deps: installing ${missing[*]}" >&2
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "ci-deps: no apt-get here: install ${missing[*]} by hand" >&2
fi
