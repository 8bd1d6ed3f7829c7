#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: take vllm-doctor's NVML snapshot and run `plan --gpu-memory auto`,
# then hold both against nvidia-smi. Exit 0 when they agree, 1 when they do not, 2 without a GPU.
#
#   scripts/gpu_check.sh            # from the repository root, with .venv installed (pip install -e .)
#   PYTHON=/path/to/python scripts/gpu_check.sh
#
# Total memory must match nvidia-smi to the MiB; used memory may move between the two reads, so it
# must match within USED_TOLERANCE_MIB (default 256).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
TOL=${USED_TOLERANCE_MIB:-256}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: nvidia-smi not found: no NVIDIA GPU or driver here" >&2
    exit 2
fi

echo "== nvidia-smi"
nvidia-smi --query-gpu=index,name,memory.total,memory.used,memory.free,driver_version --format=csv | tee "$OUT/smi.csv"
nvidia-smi --query-gpu=index,memory.total,memory.used --format=csv,noheader,nounits > "$OUT/smi-mem.csv"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits > "$OUT/smi-apps.csv" || true

echo "== vllm-doctor NVML snapshot"
"$PYTHON" -c 'import json; from vllm_doctor.gpu import snapshot; print(json.dumps(snapshot().to_json(), indent=1))' | tee "$OUT/snapshot.json"

echo "== vllm-doctor plan --gpu-memory auto"
set +e
"$PYTHON" -m vllm_doctor plan --params 7B --layers 32 --heads 32 --kv-heads 8 --head-dim 128 --dtype bfloat16 \
    --gpu-memory auto --gpu-memory-utilization 0.90 --max-model-len 8192 > "$OUT/plan.txt" 2> "$OUT/plan.err"
plan_rc=$?
"$PYTHON" -m vllm_doctor plan --params 7B --layers 32 --heads 32 --kv-heads 8 --head-dim 128 --dtype bfloat16 \
    --gpu-memory auto --gpu-memory-utilization 0.90 --max-model-len 8192 --format json > "$OUT/plan.json" 2>/dev/null
set -e
cat "$OUT/plan.txt" "$OUT/plan.err"
echo "(plan exit status $plan_rc: 0 fits, 1 does not fit)"

echo "== comparison"
"$PYTHON" - "$OUT" "$TOL" <<'EOF'
import csv, json, sys
from pathlib import Path

out, tol = Path(sys.argv[1]), int(sys.argv[2])
snap = json.loads((out / "snapshot.json").read_text())
try:
    plan = json.loads((out / "plan.json").read_text())
except ValueError:
    plan = None
smi = {int(r[0]): (int(r[1]), int(r[2])) for r in csv.reader((out / "smi-mem.csv").read_text().splitlines()) if r}
apps = [r for r in csv.reader((out / "smi-apps.csv").read_text().splitlines()) if r and r[0].strip().isdigit()]
problems = []
if not snap["available"]:
    problems.append(f"NVML snapshot unavailable: {snap['reason']}")
devices = {d["index"]: d for d in snap["devices"]}
if set(devices) != set(smi):
    problems.append(f"GPU indexes differ: NVML {sorted(devices)} vs nvidia-smi {sorted(smi)}")
for i, (total, used) in sorted(smi.items()):
    d = devices.get(i)
    if d is None:
        continue
    ok_total = d["total_mib"] == total
    ok_used = abs(d["used_mib"] - used) <= tol
    print(f"GPU {i}: total NVML {d['total_mib']} / smi {total} MiB {'OK' if ok_total else 'MISMATCH'}; "
          f"used NVML {d['used_mib']} / smi {used} MiB {'OK' if ok_used else 'MISMATCH'} (tolerance {tol})")
    if not ok_total:
        problems.append(f"GPU {i}: total memory differs")
    if not ok_used:
        problems.append(f"GPU {i}: used memory differs by more than {tol} MiB")
smi_pids = {int(r[0].strip()) for r in apps}
nvml_pids = {p["pid"] for d in snap["devices"] for p in d["processes"]}
print(f"compute processes: NVML {sorted(nvml_pids)} / nvidia-smi {sorted(smi_pids)}")
if smi_pids - nvml_pids:
    problems.append(f"processes nvidia-smi lists but NVML snapshot misses: {sorted(smi_pids - nvml_pids)}")
smallest = min(t for t, _ in smi.values()) * 2**20 if smi else None
if plan is None:
    problems.append("plan --gpu-memory auto gave no plan: " + (out / "plan.err").read_text().strip())
else:
    plan_bytes = plan["gpu"]["memory_bytes"]
    print(f"plan --gpu-memory auto: {plan_bytes:.0f} B; nvidia-smi smallest total: {smallest} B")
    if smallest is not None and plan_bytes != smallest:
        problems.append("plan's GPU memory is not nvidia-smi's total")
    m = plan["models"][0]
    expect_cache = plan_bytes * 0.90 - 14e9
    if abs(m["cache_bytes"] - expect_cache) > 1:
        problems.append(f"plan's cache {m['cache_bytes']} != total x 0.90 - 14e9 = {expect_cache}")
    print(f"plan: cache {m['cache_bytes'] / 2**30:.2f} GiB, {m['tokens']:,} tokens, {m['worst_case_sequences']} sequences of 8,192")
for p in problems:
    print("PROBLEM:", p)
print("gpu_check:", "OK" if not problems else f"{len(problems)} problem(s)")
sys.exit(1 if problems else 0)
EOF
