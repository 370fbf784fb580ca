import csv
import hashlib
import re
from pathlib import Path

SRC = Path("/workspace/contacts.csv")
OUT = Path("/workspace/contacts_clean.csv")
SHA256 = "0906d6e52380d0c5325ff870a1bbe05ebcfd11b5ccc7c2e4b855c26f35801d75"


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
    if not digits:
        return ""
    return ("+" if phone.strip().startswith("+") else "") + digits


def expected():
    seen, out = set(), []
    with SRC.open(newline="") as f:
        for row in csv.DictReader(f):
            email = row["email"].strip().lower()
            if not valid(email) or email in seen:
                continue
            seen.add(email)
            out.append([clean_name(row["name"]), email, clean_phone(row["phone"])])
    return out


def test_source_untouched():
    assert hashlib.sha256(SRC.read_bytes()).hexdigest() == SHA256


def test_clean_csv():
    with OUT.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["name", "email", "phone"]
    want = expected()
    assert 50 < len(want) < 200
    assert rows[1:] == want
