#!/bin/bash
set -euo pipefail
cd /workspace
python3 - <<'PY'
import csv
import json
from collections import defaultdict
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

cent = Decimal("0.01")
regions = defaultdict(lambda: {"orders": 0, "units": 0, "revenue": Decimal(0), "products": defaultdict(int)})
skipped = 0
with open("sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        try:
            q = int(row["quantity"])
            p = Decimal(row["unit_price"])
            if not p.is_finite():
                raise InvalidOperation
        except (ValueError, InvalidOperation):
            skipped += 1
            continue
        r = regions[row["region"].strip().upper()]
        r["orders"] += 1
        r["units"] += q
        r["revenue"] += q * p
        r["products"][row["product"]] += q
out = {"regions": {}, "skipped_rows": skipped}
for name, r in sorted(regions.items()):
    top = min(r["products"].items(), key=lambda kv: (-kv[1], kv[0]))[0]
    out["regions"][name] = {"orders": r["orders"], "units": r["units"],
                            "revenue": float(r["revenue"].quantize(cent, ROUND_HALF_UP)), "top_product": top}
total = sum((r["revenue"] for r in regions.values()), Decimal(0))
out["total_revenue"] = float(total.quantize(cent, ROUND_HALF_UP))
with open("summary.json", "w") as f:
    json.dump(out, f, indent=2)
    f.write("\n")
PY
