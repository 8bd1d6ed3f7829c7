from vllm_doctor.render.numbers import described, label


def test_a_unit_the_message_stated_beside_a_number_is_shown_with_it():
    # PyTorch's out-of-memory message: "Tried to allocate 1.16 GiB ... 79.19 GiB of which 846.00 MiB is free"
    numbers = {"alloc": 1.16, "alloc_unit": "GiB", "total": 79.19, "total_unit": "GiB", "free": 846, "free_unit": "MiB"}
    assert described(numbers) == [
        ("allocation that failed", "1.16 GiB"),
        ("GPU memory in total", "79.19 GiB"),
        ("GPU memory free", "846 MiB"),
    ]
    assert label("free") == ("GPU memory free", "")


def test_a_number_without_a_stated_unit_keeps_its_suffix_unit():
    assert described({"held_by_others_gib": 2}) == [("memory held by other processes", "2 GiB")]
