"""The one reader of `vllm serve` command lines (serveargs.py), as argparse reads them."""

from __future__ import annotations

from vllm_doctor.serveargs import items, server_words


def test_flags_in_every_form_in_order():
    model, flags = items(["--trust-remote-code", "my/model", "-tp", "2", "--max_model_len=4096", "\\",
                          "--no-enable-prefix-caching", "--seed", "-1", "--enforce-eager"])  # fmt: skip
    assert model == "my/model"  # a switch before the model does not swallow it
    assert flags == [
        ("trust_remote_code", None),
        ("tensor_parallel_size", "2"),
        ("max_model_len", "4096"),
        ("no_enable_prefix_caching", None),
        ("seed", "-1"),  # a negative number is a value
        ("enforce_eager", None),
    ]


def test_a_flag_without_a_value_at_the_end_or_before_another_flag():
    assert items(["m", "--api-key", "--port", "9000", "--unknown-switch"])[1] == [
        ("api_key", None), ("port", "9000"), ("unknown_switch", None),
    ]  # fmt: skip


def test_server_words_find_the_arguments_of_a_server():
    assert server_words(["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m", "--port", "1"]) == [
        "m",
        "--port",
        "1",
    ]
    assert server_words(["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]) == ["--model", "m"]
    assert server_words(["python", "-m", "http.server", "8000"]) is None
    assert server_words(["vllm-doctor", "serve", "--", "m"]) is None  # the wrapper is not the server
