import random
import sys
from decimal import ROUND_HALF_UP, Decimal

import pytest

sys.path.insert(0, "/workspace")
from invoice import invoice_totals  # noqa: E402

CENT = Decimal("0.01")


def reference(lines):
    net = tax = Decimal(0)
    for line in lines:
        n = (Decimal(line["price"]) * line["quantity"]).quantize(CENT, ROUND_HALF_UP)
        t = (n * Decimal(line["tax_rate"]) / 100).quantize(CENT, ROUND_HALF_UP)
        net += n
        tax += t
    return {"net": f"{net:.2f}", "tax": f"{tax:.2f}", "gross": f"{net + tax:.2f}"}


@pytest.mark.parametrize("seed", range(10))
def test_random_invoices(seed):
    rng = random.Random(seed)
    for _ in range(100):
        lines = []
        for _ in range(rng.randint(0, 12)):
            price = f"{rng.randint(0, 50000) / 1000:.3f}"
            rate = rng.choice(["0", "5", "7.5", "12.5", "19", "20", "21", "8.875"])
            lines.append({"price": price, "quantity": rng.randint(0, 40), "tax_rate": rate})
        assert invoice_totals(lines) == reference(lines)


def test_classic_float_traps():
    for price in ("1.005", "2.675", "1.015", "0.285", "1.255", "8.345"):
        line = {"price": price, "quantity": 1, "tax_rate": "0"}
        assert invoice_totals([line]) == reference([line]), price
    many = [{"price": "0.1", "quantity": 1, "tax_rate": "0"}] * 1000
    assert invoice_totals(many)["net"] == "100.00"


def test_large_amounts_exact():
    line = {"price": "12345678.995", "quantity": 1, "tax_rate": "0"}
    assert invoice_totals([line])["net"] == "12345679.00"


def test_empty():
    assert invoice_totals([]) == {"net": "0.00", "tax": "0.00", "gross": "0.00"}


def test_negative_quantity():
    with pytest.raises(ValueError):
        invoice_totals([{"price": "1", "quantity": -2, "tax_rate": "0"}])
