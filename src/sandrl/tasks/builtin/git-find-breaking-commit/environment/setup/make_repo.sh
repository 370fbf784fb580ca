#!/bin/bash
# Builds the task's repository in /workspace with a fixed, reproducible history.
set -euo pipefail
cd /workspace
git init -q -b main .
git config user.name "Dana Developer"
git config user.email "dana@example.com"
n=0
commit() {
    n=$((n + 1))
    export GIT_AUTHOR_DATE="$((1704103200 + n * 5400)) +0000" GIT_COMMITTER_DATE="$((1704103200 + n * 5400)) +0000"
    git add -A
    git commit -q -m "$1"
}

cat > pricing.py <<'PY'
"""Price computations for the shop."""


def apply_discount(price, percent):
    """Price after a percentage discount, rounded to cents."""
    if not 0 <= percent <= 100:
        raise ValueError("percent must be between 0 and 100")
    return round(price * (100 - percent) / 100, 2)


def add_tax(price, rate):
    """Price including tax at `rate` percent, rounded to cents."""
    return round(price * (100 + rate) / 100, 2)
PY
cat > check.sh <<'SH'
#!/bin/bash
# Quick self-check of pricing.py: exits 0 when the prices are right.
cd "$(dirname "$0")"
python3 -c '
from pricing import apply_discount, add_tax
assert apply_discount(2.5, 25) == 1.88, apply_discount(2.5, 25)
assert apply_discount(100, 0) == 100
assert add_tax(10, 20) == 12
print("ok")
'
SH
chmod +x check.sh
printf '# shop\n\nPricing helpers.\n' > README.md
commit "Initial pricing module"

printf '\n## Usage\n\nRun ./check.sh to self-test.\n' >> README.md
commit "Document the self-check"

cat > catalog.py <<'PY'
"""Product catalog."""

PRODUCTS = {"pen": 1.5, "pad": 3.25}
PY
commit "Add catalog"

printf 'PRODUCTS["ink"] = 7.8\n' >> catalog.py
commit "Add ink to the catalog"

printf '# Changelog\n\n- 2.0: catalog\n' > CHANGELOG.md
commit "Start a changelog"

sed -i 's/"""Price computations for the shop."""/"""Price computations for the shop (all amounts in EUR)."""/' pricing.py
commit "Mention the currency in pricing docs"

cat > shipping.py <<'PY'
"""Shipping costs."""


def shipping_cost(weight_kg):
    return 4.9 if weight_kg < 2 else 4.9 + (weight_kg - 2) * 1.2
PY
commit "Add shipping costs"

printf 'PRODUCTS["eraser"] = 0.9\n' >> catalog.py
commit "Add eraser"

cat >> pricing.py <<'PY'


def unit_price(total, quantity):
    """Price of one unit in a multi-pack."""
    return round(total / quantity, 2)
PY
commit "Add unit_price helper"

printf -- '- 2.1: shipping, unit prices\n' >> CHANGELOG.md
commit "Update changelog for 2.1"

sed -i 's/return 4.9 if weight_kg < 2/return 4.5 if weight_kg < 2/' shipping.py
commit "Cheaper shipping for small parcels"

printf 'PRODUCTS["stapler"] = 12.0\n' >> catalog.py
commit "Add stapler"

sed -i 's|    return round(price \* (100 - percent) / 100, 2)|    return int(price * (100 - percent)) / 100|' pricing.py
commit "Simplify discount arithmetic"

printf '\nAll amounts are in EUR.\n' >> README.md
commit "README: currency"

sed -i 's/PRODUCTS\["pen"\] = 1.5/PRODUCTS["pen"] = 1.6/; s/"pen": 1.5/"pen": 1.6/' catalog.py
commit "Raise the price of pens"

cat >> shipping.py <<'PY'


def free_shipping(total):
    return total >= 50
PY
commit "Free shipping above 50"

printf -- '- 2.2: free shipping\n' >> CHANGELOG.md
commit "Update changelog for 2.2"

sed -i 's/    return round(total \/ quantity, 2)/    if quantity <= 0:\n        raise ValueError("quantity must be positive")\n    return round(total \/ quantity, 2)/' pricing.py
commit "Validate quantity in unit_price"

printf 'PRODUCTS["folder"] = 2.2\n' >> catalog.py
commit "Add folders"

printf -- '- 2.3: folders\n' >> CHANGELOG.md
commit "Update changelog for 2.3"

sed -i 's/def add_tax(price, rate):/def add_tax(price, rate=23):/' pricing.py
commit "Default tax rate of 23%"

printf -- '- 2.4: default tax rate\n' >> CHANGELOG.md
commit "Update changelog for 2.4"
