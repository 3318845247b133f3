import pytest

from state.errors import DelayLevelError
from state.levels import clamp_level, parse_duration, parse_levels

ROCKETMQ_DEFAULT = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"


def test_rocketmq_default_has_18_levels_from_1s_to_2h():
    delays = parse_levels(ROCKETMQ_DEFAULT)
    assert len(delays) == 18
    assert delays[0] == 1_000
    assert delays[4] == 60_000
    assert delays[-1] == 7_200_000


@pytest.mark.parametrize("token, millis", [("1s", 1_000), ("90s", 90_000), ("2m", 120_000),
                                           ("3h", 10_800_000), ("1d", 86_400_000)])
def test_every_unit(token, millis):
    assert parse_duration(token) == millis


@pytest.mark.parametrize("spec, bad", [("5x", "5x"), ("0s", "0s"), ("-1m", "-1m"), ("1s 1.5s", "1.5s"),
                                       ("s", "s"), ("1s 5", "5"), ("1S", "1S")])
def test_bad_tokens_are_named(spec, bad):
    with pytest.raises(DelayLevelError, match=repr(bad).replace("(", r"\(")):
        parse_levels(spec)


@pytest.mark.parametrize("spec", ["", "   "])
def test_empty_is_refused(spec):
    with pytest.raises(DelayLevelError, match="empty"):
        parse_levels(spec)


@pytest.mark.parametrize("spec, bad", [("1s 1s", "'1s' \\(level 2\\)"), ("1m 30s", "'30s' \\(level 2\\)"),
                                       ("1s 5s 60s 1m", "'1m' \\(level 4\\)")])
def test_duplicates_and_out_of_order_are_refused(spec, bad):
    with pytest.raises(DelayLevelError, match=bad):
        parse_levels(spec)


def test_clamping_bounds():
    assert clamp_level(0, 18) == 0
    assert clamp_level(1, 18) == 1
    assert clamp_level(18, 18) == 18
    assert clamp_level(19, 18) == 18
    assert clamp_level(10_000, 3) == 3
    with pytest.raises(ValueError):
        clamp_level(-1, 18)

