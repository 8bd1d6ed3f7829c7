"""env.txt holds what vLLM's collect_env gathers (serve/hostenv.py): torch, its CUDA build and
NCCL from the package metadata of vLLM's python, without importing torch; the CPU, NUMA, the
limits, /dev/shm and the packages; masked as the rest of the report."""

from __future__ import annotations

import importlib.metadata
import sys

from test_serve import report_dirs, run_serve

from conftest import FAKE_VLLM, LAB
from vllm_doctor.serve import hostenv


def _site(tmp_path):
    """A site directory with torch 2.5.1+cu124 and nvidia-nccl-cu12 as pip installs them (a
    dist-info per package, torch/version.py); importing this torch raises."""
    site = tmp_path / "site"
    for name, version in (("torch", "2.5.1+cu124"), ("nvidia_nccl_cu12", "2.21.5")):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("raise RuntimeError('torch was imported')\n")
    (site / "torch" / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.5.1+cu124'\ndebug = False\n"
        "cuda: Optional[str] = '12.4'\ngit_version = 'a8d6afb511a69687bbb2b7e88a3cf67917e1697e'\nhip: Optional[str] = None\n"
    )
    return site


def test_torch_cuda_and_nccl_come_from_the_metadata_without_importing_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(_site(tmp_path)))
    facts = hostenv.probe(sys.executable)
    assert facts["torch.version"] == "2.5.1+cu124" and facts["torch.cuda"] == "12.4" and facts["torch.hip"] is None
    text = "\n".join(hostenv.lines(facts))
    assert "torch: 2.5.1+cu124 (git a8d6afb511a69687bbb2b7e88a3cf67917e1697e)" in text
    assert "torch built for CUDA: 12.4; HIP: none" in text and "NCCL: 2.21.5 (nvidia-nccl-cu12)" in text
    assert "  torch==2.5.1+cu124" in text


def test_env_txt_has_collect_envs_facts(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnopqrstuvwxyz0123")
    vllm = tmp_path / "vllm"  # a python script, as pip installs vllm's: the fake run by this interpreter
    vllm.write_text(f"#!{sys.executable}\nimport runpy\nrunpy.run_path({str(FAKE_VLLM)!r}, run_name='__main__')\n")
    vllm.chmod(0o755)
    rc, _, err = run_serve(tmp_path, vllm, FAKE_REPLAY=LAB / "tp-divisibility.log", FAKE_END="exit:1")
    assert rc == 1, err.decode()
    env = (report_dirs(tmp_path)[0] / "env.txt").read_text()
    assert f"python (vLLM): {sys.version.split()[0]}" in env  # the fake vllm's own interpreter
    for part in (
        "NCCL: ",
        "CPU: ",
        "CPU flags: ",
        "NUMA: ",
        "ulimit: open files ",
        "/dev/shm: ",
        "packages (vLLM's python):",
    ):
        assert part in env, part
    assert f"  nvidia-ml-py=={importlib.metadata.version('nvidia-ml-py')}" in env
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in env and "HF_TOKEN=[REDACTED]" in env


def test_a_vllm_that_is_no_python_script_gives_fewer_lines(tmp_path):
    binary = tmp_path / "vllm"
    binary.write_bytes(b"\x7fELF")
    assert hostenv.python_of(str(binary)) is None and hostenv.probe(None) == {}
    text = "\n".join(hostenv.lines({}))
    assert "NCCL: no nvidia-nccl package" in text and "ulimit: " in text and "torch" not in text
