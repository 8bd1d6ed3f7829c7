"""The tensor-parallel size a log shows without saying it, and the sizes that split a quantised weight."""

from __future__ import annotations

from vllm_doctor.capacity.shape import ModelShape
from vllm_doctor.data import Evidence, Match, Rule
from vllm_doctor.facts import Facts
from vllm_doctor.knowledge.checks import CHECKS, CheckInput, Options


def quant(values: dict, lines: list[str] = (), shape: ModelShape | None = None):
    facts = Facts()
    match = Match(Rule("r", "diagnosis", "t", "e", "r.toml"), [Evidence(i + 1, t) for i, t in enumerate(lines)])
    return CHECKS["quant_tp"](CheckInput(dict(values), facts, match, Options(shape=shape)))


def test_ranks_in_the_prefixes_show_tp():
    r = quant({}, ["(Worker_TP3 pid=9) ERROR x", "(Worker_TP0 pid=8) ERROR x"])
    assert r.values["multi_gpu"] is True and r.values["tp_at_least"] == 4 and r.confidence == "medium"
    assert quant({}, ["[rank1]: ValueError: x"]).values["tp_at_least"] == 2
    assert quant({}, ["(VllmWorkerProcess pid=3) ERROR x"]).values["multi_gpu"] is True


def test_a_single_gpu_is_proven_by_tp_1_or_the_single_worker():
    assert quant({"tensor_parallel_size": 1}).values["single_gpu"] is True
    assert quant({}, ["(Worker pid=230) ERROR x"]).values["single_gpu"] is True
    hint = quant({}, ["ValueError: Weight input_size_per_partition = 3696 ..."])
    assert hint.values["multi_gpu"] is True and hint.confidence == "low"


def test_the_config_says_the_tp_that_cut_the_weight_and_the_sizes_that_fit():
    shape = ModelShape(80, 64, 8, 128, text_config={"intermediate_size": 29568, "hidden_size": 8192})
    r = quant({"what": "input_size_per_partition", "dimension": 3696, "limit": 128}, shape=shape)
    assert r.values["tp_inferred"] == 8 and r.values["quant_dimension_name"] == "intermediate_size"
    assert r.values["quant_tp_sizes"] == [1] and r.values["quant_tp_below"] == 1  # 29568 = 128 x 231
    stated = quant({"tensor_parallel_size": 8, "what": "input_size_per_partition", "dimension": 3696, "limit": 128})
    assert stated.values["quant_dimension"] == 29568 and stated.values["quant_tp_below"] == 1
