"""A sweep point and its delay, parsed once from how paths write them."""

import pytest

from gmc.rollouts.delays import named_delays
from gmc.sweep.points import Delay, Point, delay_order, is_fixed


@pytest.mark.parametrize(
    "text, mode, fixed, trace, title",
    [
        ("0", "fixed", 0, None, "delay d = 0"),
        ("64", "fixed", 64, None, "delay d = 64"),
        ("latency", "latency", None, None, "latency model"),
        ("ray", "ray", None, None, "real asynchrony (Ray)"),
        ("trace-run7", "trace", None, "run7", "replayed trace run7"),
    ],
)
def test_a_delay_is_parsed_once_and_written_back_as_paths_write_it(text, mode, fixed, trace, title):
    delay = Delay.parse(text)
    assert (delay.mode, delay.fixed, delay.trace, delay.title) == (mode, fixed, trace, title)
    assert str(delay) == text and Delay.parse(delay) is delay and Delay.parse(str(delay)) == delay
    assert delay.is_fixed == (mode == "fixed") == is_fixed(text)


@pytest.mark.parametrize("text", ["sometimes", "-1", "8.5", "trace-", "", "Latency", "064", "²", "٦٤", " 8"])
def test_anything_else_is_refused_naming_what_a_delay_may_be(text):
    with pytest.raises(ValueError, match="neither a number, a named delay mode"):
        Delay.parse(text)


def test_delays_sort_fixed_first_then_the_named_modes_in_registry_order_then_the_traces():
    texts = ["trace-b", "ray", "64", "trace-a", "latency", "8", "0"]
    assert sorted(texts, key=delay_order) == ["0", "8", "64", *named_delays(), "trace-a", "trace-b"]
    assert sorted(map(Delay.parse, texts), key=lambda d: d.order) == [
        Delay.parse(t) for t in sorted(texts, key=delay_order)
    ]


def test_the_wildcard_matches_exactly_the_delays_the_parser_takes():
    import re

    pattern = re.compile(f"^(?:{Delay.wildcard()})$")
    for text in ["0", "64", *named_delays(), "trace-run_7"]:
        assert pattern.match(text) and Delay.parse(text)
    for text in ["sometimes", "trace-", "8.5", "064"]:
        assert not pattern.match(text)


def test_a_point_is_found_in_a_path_and_written_back():
    point = Point.find("results/train/algo~gmc/delay~latency/group~8/seed~2/summary.json")
    assert point == Point("gmc", Delay("latency"), 8, 2) == Point.of("gmc", "latency", "8", "2")
    assert point.path == "algo~gmc/delay~latency/group~8/seed~2"
    assert point.fields() == {"algorithm": "gmc", "delay": "latency", "group": 8, "seed": 2}
    assert Point.parse(f"x/{Point.of('tic', 64, 4, 0).path}").delay.fixed == 64
    assert Point.find("results/train/other") is None
    assert Point.find("results/train/algo~gmc/delay~64_old/group~8/seed~0") is None
    with pytest.raises(ValueError, match="not a sweep point"):
        Point.parse("results/train/other")
