#!/bin/bash
# Oracle: Decimal arithmetic with ROUND_HALF_UP.
set -euo pipefail
cat > /workspace/invoice.py <<'PY'
"""Invoice arithmetic."""

from decimal import ROUND_HALF_UP, Decimal

CENT = Decimal("0.01")


def line_amounts(line):
    price = Decimal(line["price"])
    quantity = line["quantity"]
    rate = Decimal(line["tax_rate"])
    if price < 0 or quantity < 0:
        raise ValueError("negative price or quantity")
    net = (price * quantity).quantize(CENT, rounding=ROUND_HALF_UP)
    tax = (net * rate / 100).quantize(CENT, rounding=ROUND_HALF_UP)
    return net, tax


def invoice_totals(lines):
    net_total = Decimal(0)
    tax_total = Decimal(0)
    for line in lines:
        net, tax = line_amounts(line)
        net_total += net
        tax_total += tax
    return {
        "net": f"{net_total:.2f}",
        "tax": f"{tax_total:.2f}",
        "gross": f"{net_total + tax_total:.2f}",
    }
PY
