#!/bin/bash
set -euo pipefail
cd /workspace
python3 - <<'PY'
import csv
import re


def valid(email):
    if email.count("@") != 1:
        return False
    local, domain = email.split("@")
    labels = domain.split(".")
    return bool(local) and len(labels) >= 2 and all(labels)


def clean_name(name):
    name = " ".join(name.split())
    if name.count(",") == 1:
        last, first = (part.strip() for part in name.split(","))
        name = f"{first} {last}".strip()
    return name


def clean_phone(phone):
    digits = re.sub(r"\D", "", phone)
    return ("+" if phone.strip().startswith("+") else "") + digits if digits else ""


seen = set()
with open("contacts.csv", newline="") as src, open("contacts_clean.csv", "w", newline="") as dst:
    w = csv.writer(dst)
    w.writerow(["name", "email", "phone"])
    for row in csv.DictReader(src):
        email = row["email"].strip().lower()
        if valid(email) and email not in seen:
            seen.add(email)
            w.writerow([clean_name(row["name"]), email, clean_phone(row["phone"])])
PY
