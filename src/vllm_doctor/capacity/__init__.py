"""The capacity stage: what a model needs from a GPU, and what fits.

capacity/ owns the model's config and shape (modelcfg.load, the entry point, over hub.py finding
config.json, shape.py normalising it into a ModelShape, params.py counting parameters), the pure KV
cache and weight arithmetic (arithmetic.py), the one NVML adapter and its GpuSnapshot (gpu.py), and
the `vllm-doctor plan` computation (plan.py; its renderers live in render/plan.py), and vLLM's
defaults by release (defaults.py, over the atlas). It may import only vllm_doctor.data,
vllm_doctor.errors, vllm_doctor.versions, vllm_doctor.serveargs and vllm_doctor.atlas beside itself, never read/,
matching/, knowledge/, render/, serve/ or cli: those stages call capacity/, not the other way round.
"""
