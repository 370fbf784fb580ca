import csv
import hashlib
import json
from decimal import Decimal
from pathlib import Path

W = Path("/workspace")
SHAS = {
    "customers.csv": "8126801f0cd32d1333ef442c595ee7f06e7fdc35af93a0eca92205f86feee329",
    "orders.jsonl": "0d647c4aab008f8aa6086ffc8375a4bd430b59e3606f344448494dc98dbb4ee1",
}


def expected():
    with (W / "customers.csv").open(newline="") as f:
        customers = list(csv.DictReader(f))
    known = {c["customer_id"] for c in customers}
    paid = {c["customer_id"]: [0, Decimal(0)] for c in customers}
    unknown = []
    for line in (W / "orders.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        o = json.loads(line)
        if o["customer_id"] not in known:
            unknown.append(o["order_id"])
        elif o["status"] == "paid":
            paid[o["customer_id"]][0] += 1
            paid[o["customer_id"]][1] += Decimal(o["amount"])
    rows = [
        [c["customer_id"], c["name"], str(paid[c["customer_id"]][0]), f"{paid[c['customer_id']][1]:.2f}"]
        for c in customers
    ]
    rows.sort(key=lambda r: (-Decimal(r[3]), r[0]))
    return rows, sorted(unknown)


def test_inputs_untouched():
    for name, sha in SHAS.items():
        assert hashlib.sha256((W / name).read_bytes()).hexdigest() == sha, name


def test_revenue():
    with (W / "customer_revenue.csv").open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["customer_id", "name", "paid_orders", "revenue"]
    want, _ = expected()
    assert rows[1:] == want


def test_unknown():
    _, unknown = expected()
    assert unknown
    got = [line.strip() for line in (W / "unknown_customers.txt").read_text().splitlines() if line.strip()]
    assert got == unknown
