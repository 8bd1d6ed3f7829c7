"""Issue 35: any Unicode and any number where a server, a config.json or a /metrics page puts a
value: argument dumps (any nesting; a lone surrogate written as `\\udfff`, which literal_eval
turns into one), the engine's config line and its model path, a collector's JSON record, the
model's config.json (through --config), /metrics label values and Prometheus' JSON answer.

Properties: no exception escapes; every format renders as UTF-8 and carries no raw control,
bidi or surrogate character (each is shown as its escape); a blocker in the same log is still
found. The plain examples at the end are the inputs the issue named."""

from __future__ import annotations

import http.server
import json
import tempfile
from pathlib import Path

import regex
from hypothesis import given
from hypothesis import strategies as st
from strategies import (
    ARG_NAMES,
    NUMBER_WORDS,
    arg_dumps,
    config_line,
    json_line,
    non_default_args,
    texts,
    values,
)

from conftest import LAB, local_http
from vllm_doctor.knowledge.checks import Options
from vllm_doctor.render import FORMATS, render

RAW = regex.compile(r"[[\p{Cc}\p{Bidi_Control}\p{Cs}]--[\t\n]]", regex.V1)  # what no output may carry
STATUSES = {"failed", "degraded", "unknown", "healthy"}
DIR = Path(tempfile.mkdtemp(prefix="vllm-doctor-properties-"))
CACHE_OOM = (LAB / "cache-oom.log").read_text().splitlines()
ARGS_AT = next(i for i, ln in enumerate(CACHE_OOM) if "non-default args:" in ln)
HEAD = CACHE_OOM[ARGS_AT].split("non-default args: ")[0]  # its process prefix: the same start's line


def shown(report) -> dict[str, str]:
    """Every format, each one UTF-8 and, but for JSON (whose \\u escapes read back as the value),
    free of raw control, bidi and surrogate characters; JSON parses."""
    out = {}
    for fmt in FORMATS:
        text = render(report, fmt)
        text.encode("utf-8")
        if fmt == "json":
            json.loads(text)
            assert not RAW.search(text.replace("\n", "")), "raw character in json"
        else:
            assert not RAW.search(text), (fmt, RAW.search(text))
        out[fmt] = text
    return out


def explained(run, lines: list[str], options: Options | None = None):
    path = DIR / "server.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    return run(path, options=options)


def with_line(at: int, line: str) -> list[str]:
    """The lab's cache OOM with one line put in place of the argument dump."""
    return [*CACHE_OOM[:at], line, *CACHE_OOM[at + 1 :]]


@given(arg_dumps)
def test_any_argument_dump(run, args):
    report = explained(run, with_line(ARGS_AT, non_default_args(args, HEAD)))
    assert report.status in STATUSES
    shown(report)
    assert "cache-oom" in {d.category for d in report.diagnoses}  # the failure after it is still found


@given(texts, st.one_of(texts.map(repr), st.sampled_from(NUMBER_WORDS)))
def test_any_model_path_and_config_value(run, model, extra):
    report = explained(run, with_line(ARGS_AT, config_line(model, extra, HEAD)))
    shown(report)
    assert "cache-oom" in {d.category for d in report.diagnoses}


@given(texts)
def test_any_json_record(run, message):
    """A collector's JSON record ({"log": ...}) unwrapped: its escapes decode to anything."""
    record = json.dumps({"log": message, "stream": "stderr"})
    report = explained(run, [*CACHE_OOM[:ARGS_AT], record, json_line(message), *CACHE_OOM[ARGS_AT:]])
    shown(report)
    assert "cache-oom" in {d.category for d in report.diagnoses}


CONFIG = json.loads((LAB.parent / "configs" / "lab-wide-llama" / "config.json").read_text())  # the lab's model
SHAPE_KEYS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size", "max_position_embeddings", "torch_dtype", "dtype",
              "rope_scaling", "sliding_window", "architectures", "model_type", "text_config", "quantization_config"]  # fmt: skip
NUMBERISH = st.one_of(values, st.sampled_from(NUMBER_WORDS), st.integers(-(2**70), 2**70))


@given(st.dictionaries(st.sampled_from(SHAPE_KEYS), NUMBERISH, min_size=1, max_size=6), st.booleans())
def test_any_config_json(run, changed, explicit):
    """The model's config.json with any fields changed to anything, found in the log's model
    directory or given as --config: a shape that cannot be read is a note beside the diagnosis
    (looked up) or one line (--config, the CLI's exit 2); the arithmetic never raises."""
    from vllm_doctor.errors import DoctorError

    model = DIR / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({**CONFIG, **changed}), encoding="utf-8")
    lines = [line.replace("/models/wide-llama", str(model)) for line in CACHE_OOM]
    options = Options(config=str(model / "config.json") if explicit else None, offline=True, lookup_model=True)
    try:
        report = explained(run, lines, options)
    except DoctorError as e:
        assert explicit and "\n" not in str(e)
        return
    shown(report)
    assert "cache-oom" in {d.category for d in report.diagnoses}


def _exposition(label: str, number: str) -> str:
    """A /metrics page with a label value and a sample value as anything (escaped as the text
    format asks: backslash, quote, newline)."""
    value = label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    page = (LAB / "healthy.metrics-1.txt").read_text(encoding="utf-8")
    return (
        page.replace('model_name="/models/tiny-llama"', f'model_name="{value}"').replace(
            "vllm:num_requests_waiting{", f'vllm:num_requests_waiting{{odd="{value}",'
        )
        + f'vllm:num_requests_running{{model_name="{value}"}} {number}\n'
    )


@given(texts, st.one_of(st.sampled_from(NUMBER_WORDS), st.floats().map(repr)))
def test_any_metrics_label_and_value(rules, label, number):
    from vllm_doctor import pipeline
    from vllm_doctor.errors import DoctorError
    from vllm_doctor.read.metrics import fetch

    path = DIR / "metrics.txt"
    path.write_text(_exposition(label, number), encoding="utf-8", errors="surrogatepass")
    try:
        report = pipeline.from_metrics([fetch(str(path))], rules)
    except DoctorError:
        return  # refused with one line (a page that is no exposition): the CLI's exit 2
    shown(report)


class Prometheus(http.server.BaseHTTPRequestHandler):
    """Prometheus' query_range answer, its label values whatever the test put in ANSWER."""

    answer = b""

    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(Prometheus.answer)

    def log_message(self, *a):
        pass


@given(texts, texts)
def test_any_prometheus_label(rules, instance, model):
    from vllm_doctor.cli.fleet import from_prometheus
    from vllm_doctor.errors import DoctorError

    metric = {"instance": instance, "model_name": model, "engine": "0"}
    result = [
        {"metric": {"__name__": name, **metric}, "values": [[1000.0 + 15 * i, str(v)] for i in range(4)]}
        for name, v in (
            ("vllm:num_requests_running", 3),
            ("vllm:num_requests_waiting", 9),
            ("vllm:kv_cache_usage_perc", 0.99),
        )  # fmt: skip
    ]
    Prometheus.answer = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()
    with local_http(Prometheus) as url:
        try:
            report = from_prometheus(url, 1000.0, 1060.0, rules=rules)
        except DoctorError:
            return
    shown(report)


# --- the inputs the issue named --------------------------------------------------------------------


def test_a_lone_surrogate_escape_in_the_argument_dump(run):
    """`'\\udfff'` (six ASCII characters) in non-default args: literal_eval makes a lone surrogate
    of it, which no UTF-8 writer took (exit 3 in every format)."""
    line = CACHE_OOM[ARGS_AT].replace("'model_tag': '/models/wide-llama'", "'model_tag': '\\udfff'")
    assert "\\udfff" in line
    report = explained(run, with_line(ARGS_AT, line))
    out = shown(report)
    assert report.status == "failed" and "\\udfff" in out["text"] + out["markdown"]


def test_a_lone_surrogate_in_a_prometheus_label(rules):
    from vllm_doctor.cli.fleet import from_prometheus

    result = [{"metric": {"__name__": "vllm:num_requests_waiting", "instance": "a:8000", "model_name": "\ud800"},
               "values": [[1000.0, "9"], [1015.0, "9"]]}]  # fmt: skip
    Prometheus.answer = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()
    assert b"\\ud800" in Prometheus.answer
    with local_http(Prometheus) as url:
        shown(from_prometheus(url, 1000.0, 1060.0, rules=rules))


def test_every_argument_name_the_facts_read_takes_a_surrogate(run):
    args = {name: "\udfff" for name in ARG_NAMES}
    shown(explained(run, with_line(ARGS_AT, non_default_args(args, HEAD))))
