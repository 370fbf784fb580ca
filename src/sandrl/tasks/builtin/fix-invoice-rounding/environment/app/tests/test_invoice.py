import pytest

from invoice import invoice_totals


def test_simple():
    assert invoice_totals([{"price": "10.00", "quantity": 3, "tax_rate": "20"}]) == {
        "net": "30.00",
        "tax": "6.00",
        "gross": "36.00",
    }


def test_half_up():
    assert invoice_totals([{"price": "2.675", "quantity": 1, "tax_rate": "0"}])["net"] == "2.68"
    assert invoice_totals([{"price": "0.125", "quantity": 1, "tax_rate": "0"}])["net"] == "0.13"


def test_tax_rounded_per_line():
    lines = [{"price": "0.10", "quantity": 1, "tax_rate": "5"}] * 3
    assert invoice_totals(lines) == {"net": "0.30", "tax": "0.03", "gross": "0.33"}


def test_negative():
    with pytest.raises(ValueError):
        invoice_totals([{"price": "-1", "quantity": 1, "tax_rate": "0"}])
