"""The commands about a start: `check` (what it would fail on), `serve` (the start, wrapped) and
`plan` (the arithmetic before it). commands.py registers them; their options come from options.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vllm_doctor.cli.options import (
    BlockSizeOpt,
    Color,
    ColorOpt,
    CpuKvSpaceOpt,
    FailOn,
    FailOnOpt,
    FormatOpt,
    KvCacheMemoryOpt,
    ModelArgs,
    NoRedactOpt,
    OfflineOpt,
    OutputOpt,
    Preflight,
    QuietOpt,
    RulesDirs,
    StrictRules,
    TargetConcurrency,
    VerboseOpt,
    exit_code,
    fail,
    finite,
    load_rules,
    target,
    verbosity,
)
from vllm_doctor.cli.sources import line, stamp
from vllm_doctor.errors import MAX_GPUS, MAX_HEADS, MAX_LAYERS, MAX_TOKENS, MAX_TP, MAX_WIDTH
from vllm_doctor.knowledge.rulebook import LOG_KINDS

# check and serve read the vllm serve command line as given: everything after -- is vLLM's
VLLM_ARGS = {"allow_interspersed_args": False, "ignore_unknown_options": True}
TerminationLogOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--termination-log",
        metavar="PATH",
        help="On a bad exit write the cause, first fix and corrected command here, in at most 4096 bytes "
        "(Kubernetes' termination message; default: /dev/termination-log when it exists and is writable).",
    ),
]

# serve's waits: finite (--grace nan never came), at most a day
_GraceOpt = Annotated[
    float,
    typer.Option(
        "--grace",
        parser=finite(0.0, 86400.0),
        metavar="SECONDS",
        help="Seconds after a forwarded SIGINT/SIGTERM/SIGHUP before SIGKILL.",
    ),
]
_ReapWaitOpt = Annotated[
    float,
    typer.Option(
        "--reap-wait",
        parser=finite(0.0, 86400.0),
        metavar="SECONDS",
        help="Seconds vLLM's other processes get to exit after the main one.",
    ),
]

_DiagnoseTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--diagnose-timeout",
        parser=finite(1.0, 86400.0),
        metavar="SECONDS",
        help="Seconds for the exit diagnosis, the report and the termination message (a pod's grace period is "
        "30 s): past them, the output's start and end are read, and the report says which lines were not.",
    ),
]


def check(
    ctx: typer.Context,
    vllm_args: Annotated[Optional[list[str]], ModelArgs] = None,
    list_checks: Annotated[bool, typer.Option("--list", help="List the checks, one line each.")] = False,
    only: Annotated[list[str], typer.Option("--only", help="Run only this check (repeatable).", metavar="NAME")] = [],  # noqa: B006
    format: FormatOpt = None,
    output: OutputOpt = None,
    fail_on: FailOnOpt = FailOn.blocker,
    offline: OfflineOpt = False,
    no_gpu: Annotated[bool, typer.Option("--no-gpu", help="Skip the NVML snapshot (the GPU checks say so).")] = False,
    vllm_bin: Annotated[
        Optional[str],
        typer.Option("--vllm-bin", help="The vllm executable whose Python answers (default: vllm on PATH)."),
    ] = None,
    no_ask_vllm: Annotated[
        bool, typer.Option("--no-ask-vllm", help="Do not ask the installed vLLM's own parser and config check.")
    ] = False,
    no_redact: NoRedactOpt = False,
    color: ColorOpt = Color.auto,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Find what `vllm serve` would fail on, before it starts (vLLM's own parser and config check where vLLM is
    installed; fit, TP, the GPUs now, the host, the model; the environment too). Exit status: 0 no blocker,
    1 a blocker, 2 usage error, 4 unknown (fit or model not checked)."""
    if list_checks:
        from vllm_doctor.preflight.checks import listing

        return typer.echo(listing())
    from vllm_doctor.cli.output import emit
    from vllm_doctor.preflight.args import parse
    from vllm_doctor.preflight.run import preflight

    fmt, path = target(ctx, format, output, color)
    level = verbosity(quiet, verbose)
    args = _vllm_args(ctx, list(vllm_args or []))
    asked = not no_ask_vllm and (not only or "vllm_config" in only)
    report = preflight(parse(args), only=list(only), offline=offline, no_gpu=no_gpu, ask_vllm=asked, vllm_bin=vllm_bin)
    emit(stamp(report, ctx, []), fmt, path, redact=not no_redact, verbosity=level)
    raise typer.Exit(exit_code(report, fail_on))


def serve(
    ctx: typer.Context,
    vllm_args: Annotated[list[str], ModelArgs],
    vllm_bin: Annotated[
        Optional[str], typer.Option("--vllm-bin", help="The vllm executable (default: vllm on PATH).")
    ] = None,
    report_dir: Annotated[
        Optional[Path],
        typer.Option(
            "--report-dir", help="Each incident in a new directory under this one (default: ./vllm-doctor-reports/)."
        ),
    ] = None,
    always_report: Annotated[
        bool, typer.Option("--always-report", help="Write the report after a clean exit too.")
    ] = False,
    log_file: Annotated[Optional[Path], typer.Option("--log-file", help="Also keep the raw output here.")] = None,
    grace: _GraceOpt = 30.0,
    reap_wait: _ReapWaitOpt = 15.0,
    diagnose_timeout: _DiagnoseTimeoutOpt = 20.0,
    watch_samples: Annotated[
        int,
        typer.Option(
            "--watch-samples",
            min=1,
            metavar="N",
            help="Warn after this many stats samples with requests waiting on a full KV cache.",
        ),
    ] = 3,
    no_watch: Annotated[
        bool, typer.Option("--no-watch", help="Do not watch the stats lines while the server runs.")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="After a bad exit, one line (not the diagnosis' first screen).")
    ] = False,
    termination_log: TerminationLogOpt = None,
    no_redact: NoRedactOpt = False,
    rules_dirs: RulesDirs = [],  # noqa: B006
    strict_rules: StrictRules = False,
    preflight: Annotated[
        Preflight,
        typer.Option("--preflight", help="Run `check` first: warn (and start), strict (refuse a blocker), off."),
    ] = Preflight.warn,
) -> None:
    """Run vllm serve, pass its output through, and on a bad exit write a diagnosed incident report.

    Exits with vLLM's own status (128 + N when a signal N ended it); 1 when --preflight strict refuses;
    2 when --strict-rules refuses a bad --rules file (else it is one warning, and the other rules run)."""
    from vllm_doctor.preflight.gate import before_serve
    from vllm_doctor.serve import ServeOptions, run

    vllm_args = _vllm_args(ctx, vllm_args)
    rules = load_rules(list(rules_dirs), strict_rules, LOG_KINDS) if rules_dirs else None  # before the child starts
    if (refused := before_serve(list(vllm_args), preflight.value)) is not None:
        raise typer.Exit(refused)
    outcome = run(
        ServeOptions(
            vllm_args=list(vllm_args),
            vllm_bin=vllm_bin,
            report_dir=report_dir,
            always_report=always_report,
            log_file=log_file,
            grace=grace,
            reap_wait=reap_wait,
            diagnose_timeout=diagnose_timeout,
            quiet=quiet,
            watch=not no_watch,
            watch_samples=watch_samples,
            redact=not no_redact,
            rules=rules,
            termination_log=termination_log,
        )
    )
    raise typer.Exit(outcome.status)


def _vllm_args(ctx: typer.Context, args: list[str]) -> list[str]:
    """serve's and check's MODEL and vLLM arguments. An option before `--` that the command does not
    know is refused (click leaves it, and the `--`, among the arguments): a typo of our own option
    must not reach vLLM. Without a `--`, an option before the model is vLLM's, unless it is a near
    miss of ours."""
    import difflib

    command = ctx.info_name or "serve"
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        fail(f"give the model after --: vllm-doctor {command} [OPTIONS] -- MODEL [vllm serve args]")
    ours = [o for p in ctx.command.params for o in (*p.opts, *p.secondary_opts)]
    given = ctx.meta.get("argv") or []
    dashes = "--" in given
    before = given[: given.index("--")] if dashes else args[:1]
    for word in before:
        name = word.split("=", 1)[0]
        if not word.startswith("-") or word == "-" or name in ours:
            continue
        close = difflib.get_close_matches(name, [o for o in ours if o.startswith("--")], n=1, cutoff=0.75)
        if close or dashes:
            hint = f"; did you mean {close[0]}?" if close else "; vLLM's arguments go after --"
            fail(f"{command}: no such option {word}{hint}")
    return args


# the flags and variables of a start that shape its cache (capacity/start.py), as plan takes them
_DeviceOpt = Annotated[Optional[str], typer.Option("--device", help="cpu: the CPU backend (128-token blocks).")]
_NoHybridOpt = Annotated[
    bool, typer.Option("--disable-hybrid-kv-cache-manager", help="Windowed layers sized as full attention.")
]
_PrefixOpt = Annotated[
    bool, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching", help="Prefix caching (Mamba state).")
]
_BatchedOpt = Annotated[
    Optional[int],
    typer.Option("--max-num-batched-tokens", min=1, max=MAX_TOKENS, help="Tokens in flight of windowed layers."),
]
_EnvOpt = Annotated[list[str], typer.Option("--env", help="VAR=value of the start (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1).")]
_PromptLenOpt = Annotated[
    Optional[int],
    typer.Option("--prompt-len", min=1, max=MAX_TOKENS, help="Show the blocks a prompt of this length takes."),
]
_SamplesOpt = Annotated[
    int, typer.Option("--samples", min=1, max=MAX_TOKENS, help="Parallel samples of that prompt (shared vs not).")
]
_OverheadOpt = Annotated[
    Optional[str],
    typer.Option(
        "--overhead",
        help="Activation + non-torch + CUDA graphs per GPU, e.g. 2GB (default: the estimate check reserves; 0GB: none).",
    ),
]

# plan's counts, bounded: -tp 10**18 counted TP sizes to it, --layers 10**30 overflowed
_LayersOpt = Annotated[Optional[int], typer.Option("--layers", min=1, max=MAX_LAYERS, help="Layers (shape by hand).")]
_HeadsOpt = Annotated[
    Optional[int], typer.Option("--heads", min=1, max=MAX_HEADS, help="Attention heads (for valid TP sizes).")
]
_GpusOpt = Annotated[
    Optional[int], typer.Option("--gpus", min=1, max=MAX_GPUS, help="GPUs available (default: NVML's count).")
]
_MaxModelLenOpt = Annotated[
    Optional[int],
    typer.Option("--max-model-len", min=1, max=MAX_TOKENS, help="Tokens per sequence (default: the model's maximum)."),
]
_TpOpt = Annotated[int, typer.Option("--tensor-parallel-size", "-tp", min=1, max=MAX_TP, help="Tensor-parallel size.")]


def plan(
    ctx: typer.Context,
    models: Annotated[
        Optional[list[str]],
        typer.Argument(
            help="Repo ids or model directories; several share one GPU.", metavar="[MODEL]...", show_default=False
        ),
    ] = None,
    config: Annotated[
        list[str], typer.Option("--config", help="A config.json (repeatable: one model each).", metavar="FILE")
    ] = [],  # noqa: B006
    params: Annotated[
        Optional[str], typer.Option("--params", help="Parameters, e.g. 7B (overrides the config).")
    ] = None,
    layers: _LayersOpt = None,
    heads: _HeadsOpt = None,
    kv_heads: Annotated[Optional[int], typer.Option("--kv-heads", min=1, max=MAX_HEADS, help="KV heads.")] = None,
    head_dim: Annotated[Optional[int], typer.Option("--head-dim", min=1, max=MAX_WIDTH, help="Head size.")] = None,
    dtype: Annotated[
        Optional[str], typer.Option("--dtype", help="Weight dtype (default: the config's, else bfloat16).")
    ] = None,
    gpu_memory: Annotated[
        str, typer.Option("--gpu-memory", help="Per GPU: 80GB (10^9 B), 80GiB (2^30 B), or auto (NVML).")
    ] = "auto",
    gpus: _GpusOpt = None,
    utilization: Annotated[
        Optional[float],
        typer.Option("--gpu-memory-utilization", help="Fraction of each GPU vLLM may use (default: vLLM's, 0.92)."),
    ] = None,
    max_model_len: _MaxModelLenOpt = None,
    tp: _TpOpt = 1,
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype", help="auto (the model's dtype) or fp8.")] = "auto",
    quantization: Annotated[
        Optional[str], typer.Option("--quantization", help="awq, gptq, fp8, ... (bits per weight).")
    ] = None,
    target_concurrency: TargetConcurrency = None,
    block_size: BlockSizeOpt = None,
    prompt_len: _PromptLenOpt = None,
    samples: _SamplesOpt = 1,
    overhead: _OverheadOpt = None,
    kv_cache_memory: KvCacheMemoryOpt = None,
    cpu_kvcache_space: CpuKvSpaceOpt = None,
    device: _DeviceOpt = None,
    no_hybrid: _NoHybridOpt = False,
    prefix_caching: _PrefixOpt = True,
    batched: _BatchedOpt = None,
    env: _EnvOpt = [],  # noqa: B006 (typer's list default)
    offline: OfflineOpt = False,
    no_gpu: Annotated[bool, typer.Option("--no-gpu", help="Do not ask NVML for the GPUs.")] = False,
    format: FormatOpt = None,
    output: OutputOpt = None,
    color: ColorOpt = Color.auto,
) -> None:
    """The capacity arithmetic before you start: weights, KV cache, bytes per token, tokens and
    sequences that fit, valid TP sizes and a ready `vllm serve` line. Exit 1 when it does not fit."""
    from vllm_doctor.capacity import plan as planner
    from vllm_doctor.capacity.gpu import skipped, snapshot
    from vllm_doctor.cli.output import emit

    fmt, path = target(ctx, format, output, color)
    request = planner.PlanRequest(
        models=list(models or []), configs=list(config), params=params, layers=layers, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, gpu_memory=gpu_memory, gpus=gpus,
        max_model_len=max_model_len, tp=tp, kv_cache_dtype=kv_cache_dtype,
        quantization=quantization, target_concurrency=target_concurrency, block_size=block_size or 0,
        prompt_len=prompt_len, samples=samples, overhead=overhead, offline=offline,
        kv_cache_memory=kv_cache_memory, cpu_kvcache_space=cpu_kvcache_space, device=device,
        hybrid_manager=not no_hybrid, prefix_caching=prefix_caching, max_num_batched_tokens=batched,
        env=_env_words(env), **({"utilization": utilization} if utilization is not None else {}),
    )  # fmt: skip
    result = planner.make_plan(request, skipped("--no-gpu") if no_gpu else snapshot())
    result.notes += [line(s) for s in ctx.meta.get("settings") or []]  # a config file's or a variable's
    emit(result, fmt, path, done=f"plan {'fits' if result.fits else 'does not fit'};")
    raise typer.Exit(0 if result.fits else 1)


def _env_words(words: list[str]) -> dict[str, str]:
    from vllm_doctor.errors import DoctorError

    out = {}
    for w in words:
        key, eq, value = w.partition("=")
        if not eq or not key:
            raise DoctorError(f"--env {w!r}: VAR=value")
        out[key] = value
    return out
