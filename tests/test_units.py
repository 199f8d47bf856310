import pytest

from simtrain.units import UnitError, fmt_size, parse_bandwidth, parse_bytes, parse_time


def test_decimal_binary_and_bits():
    assert parse_bandwidth("300 GB/s") == 300e9
    assert parse_bandwidth("200 Gb/s") == 25e9          # 200e9 bit/s / 8
    assert parse_bytes("80 GiB") == 80 * 2**30
    assert parse_bytes("80 GB") == 80e9
    assert parse_time("5 us") == pytest.approx(5e-6)
    assert parse_time("1.5 ms") == pytest.approx(1.5e-3)


def test_bare_number_is_an_error_that_shows_the_spelled_form():
    with pytest.raises(UnitError, match='"300 GB/s"'):
        parse_bandwidth(300)
    with pytest.raises(UnitError, match="unknown"):
        parse_bandwidth("300 GHz")


def test_fmt_size_picks_the_largest_binary_unit():
    """1536 B = 1.5 x 2^10 -> KiB; 2^20 exactly -> MiB; 3 x 2^30 -> GiB; under 1 KiB in bytes."""
    assert [fmt_size(x) for x in (100, 1536, 2**20, 3 * 2**30)] == ["100 B", "1.50 KiB", "1.00 MiB", "3.00 GiB"]
