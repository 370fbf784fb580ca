import re
from pathlib import Path

ORIG = Path("/tests/app.conf.orig")
CONF = Path("/workspace/app.conf")


def expected():
    out = []
    section = None
    for line in ORIG.read_text().splitlines(keepends=True):
        m = re.match(r"^\[(.+)\]\s*$", line)
        if m:
            section = m.group(1)
        if section == "legacy":
            continue
        if section == "server" and re.match(r"^port\s*=", line):
            line = "port = 8080\n"
        if section == "logging" and line == "# level = debug\n":
            line = "level = info\n"
        out.append(line)
    return "".join(out)


def test_config_edited():
    assert CONF.is_file()
    assert CONF.read_text() == expected()


def test_parses_as_ini():
    import configparser

    cp = configparser.RawConfigParser(inline_comment_prefixes=None)
    cp.read_string(CONF.read_text())
    assert cp["server"]["port"] == "8080"
    assert cp["database"]["port"] == "5432"
    assert cp["server"]["export_port"] == "9000"
    assert cp["logging"]["level"] == "info"
    assert "legacy" not in cp
