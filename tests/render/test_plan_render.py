"""render/plan.py: the Plan that capacity/plan.py computes, as text, Markdown and JSON (schema vllm-doctor/plan/1)."""

from __future__ import annotations

import json

from vllm_doctor.capacity.plan import PlanRequest, make_plan
from vllm_doctor.render import plan as render

SEED = PlanRequest(params="7B", layers=32, kv_heads=8, head_dim=128, dtype="bfloat16", gpu_memory="80GB",
                   max_model_len=8192)  # fmt: skip


def test_three_renderings_of_one_plan():
    plan = make_plan(SEED)
    data = json.loads(render.json(plan))
    assert data == json.loads(json.dumps(render.to_dict(plan)))
    assert data["schema"] == "vllm-doctor/plan/1" and data["fits"] is True
    assert data["models"][0]["kv_bytes_per_token"] == 131_072
    text = render.text(plan)
    assert text.startswith("vllm-doctor plan: fits\nGPU: 80.0 GB = 74.5 GiB") and text.endswith("\n")
    assert "valid --tensor-parallel-size: 1, 2, 4, 8" in text
    md = render.markdown(plan)
    assert md.startswith("## vllm-doctor plan: fits") and "| 1 weights |" in md


def test_the_model_title_names_heads_and_kv_heads_apart():
    """Not "8 KV heads of 32": attention heads, then KV heads."""
    from dataclasses import replace

    text = render.text(make_plan(replace(SEED, heads=32)))
    assert "32 layers, 32 attention heads, 8 KV heads, head dim 128" in text and "KV heads of" not in text


def test_a_report_rendered_does_not_load_the_plan_renderer():
    """render/__init__ imports render.plan (capacity.plan, kvcache) only for a Plan: not on every report's start."""
    import subprocess
    import sys

    from conftest import LAB

    code = (
        "import sys\n"
        "from vllm_doctor.pipeline import explain\n"
        "from vllm_doctor.render import render\n"
        f"r = explain([{str(LAB / 'healthy.log')!r}])\n"
        "for f in ('json', 'markdown', 'html'):\n"
        "    render(r, f)\n"
        "print(sorted(m for m in sys.modules if m in ('vllm_doctor.render.plan', 'vllm_doctor.capacity.plan')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
