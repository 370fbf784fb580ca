import csv
import hashlib
import json
from collections import defaultdict
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path

SRC = Path("/workspace/sales.csv")
SHA256 = "d68ee0e5748f2358d1bd78b0cd491bc1e564bf42e161cbd7733b8bc4230f04ab"


def expected():
    regions = defaultdict(lambda: {"orders": 0, "units": 0, "revenue": Decimal(0), "products": defaultdict(int)})
    skipped = 0
    with SRC.open(newline="") as f:
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
    cent = Decimal("0.01")
    out = {}
    for name, r in regions.items():
        top = sorted(r["products"].items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
        out[name] = {
            "orders": r["orders"],
            "units": r["units"],
            "revenue": r["revenue"].quantize(cent, ROUND_HALF_UP),
            "top_product": top,
        }
    total = sum((r["revenue"] for r in regions.values()), Decimal(0)).quantize(cent, ROUND_HALF_UP)
    return out, total, skipped


def test_source_untouched():
    assert hashlib.sha256(SRC.read_bytes()).hexdigest() == SHA256


def test_summary():
    data = json.loads(Path("/workspace/summary.json").read_text(), parse_float=Decimal)
    regions, total, skipped = expected()
    assert data["skipped_rows"] == skipped
    assert Decimal(str(data["total_revenue"])) == total
    assert set(data["regions"]) == set(regions)
    for name, want in regions.items():
        got = data["regions"][name]
        assert got["orders"] == want["orders"], name
        assert got["units"] == want["units"], name
        assert Decimal(str(got["revenue"])) == want["revenue"], name
        assert got["top_product"] == want["top_product"], name
