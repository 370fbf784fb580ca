#!/bin/bash
set -euo pipefail
cd /workspace
python3 - <<'PY'
import csv
import json
from decimal import Decimal

with open("customers.csv", newline="") as f:
    customers = list(csv.DictReader(f))
stats = {c["customer_id"]: [0, Decimal(0)] for c in customers}
unknown = []
with open("orders.jsonl") as f:
    for line in f:
        if not line.strip():
            continue
        order = json.loads(line)
        if order["customer_id"] not in stats:
            unknown.append(order["order_id"])
        elif order["status"] == "paid":
            stats[order["customer_id"]][0] += 1
            stats[order["customer_id"]][1] += Decimal(order["amount"])
customers.sort(key=lambda c: (-stats[c["customer_id"]][1], c["customer_id"]))
with open("customer_revenue.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["customer_id", "name", "paid_orders", "revenue"])
    for c in customers:
        n, total = stats[c["customer_id"]]
        w.writerow([c["customer_id"], c["name"], n, f"{total:.2f}"])
with open("unknown_customers.txt", "w") as f:
    f.writelines(o + "\n" for o in sorted(unknown))
PY
