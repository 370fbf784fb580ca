"""Invoice arithmetic."""


def line_amounts(line):
    price = float(line["price"])
    quantity = line["quantity"]
    rate = float(line["tax_rate"])
    if price < 0 or quantity < 0:
        raise ValueError("negative price or quantity")
    net = round(price * quantity, 2)
    tax = round(net * rate / 100, 2)
    return net, tax


def invoice_totals(lines):
    net_total = 0.0
    tax_total = 0.0
    for line in lines:
        net, tax = line_amounts(line)
        net_total += net
        tax_total += tax
    return {
        "net": f"{net_total:.2f}",
        "tax": f"{tax_total:.2f}",
        "gross": f"{net_total + tax_total:.2f}",
    }
