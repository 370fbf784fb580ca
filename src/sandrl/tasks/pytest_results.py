"""Per-test results of a pytest run: from its "short test summary info" text, or from its JUnit XML.

Terminal-Bench 1 judges a task from the summary lines ``pytest -rA`` prints (``PASSED
tests/test_outputs.py::test_x``). SWE-bench grading here reads pytest's JUnit XML report instead,
because that is written by pytest itself into a file: a test that *prints* "PASSED other_test"
changes nothing in it.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from enum import StrEnum


class TestStatus(StrEnum):
    """The outcome of one test, in pytest's words."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    PASSED = "PASSED"
    FAILED = "FAILED"
    ERROR = "ERROR"
    SKIPPED = "SKIPPED"
    XFAIL = "XFAIL"
    XPASS = "XPASS"

    @property
    def ok(self) -> bool:
        """Passed, as both harnesses count it: an expected failure is a pass, a skip is not."""
        return self in (TestStatus.PASSED, TestStatus.XFAIL)


# When one test has several outcomes (a failure and a teardown error, a duplicate id), the worst wins.
_SEVERITY = {
    TestStatus.PASSED: 0,
    TestStatus.XFAIL: 1,
    TestStatus.SKIPPED: 2,
    TestStatus.XPASS: 3,
    TestStatus.FAILED: 4,
    TestStatus.ERROR: 5,
}

_SUMMARY_HEADER = re.compile(r"^=+\s*short test summary info\s*=+\s*$", re.IGNORECASE | re.MULTILINE)
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(.+)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _worst(old: TestStatus | None, new: TestStatus) -> TestStatus:
    return new if old is None or _SEVERITY[new] >= _SEVERITY[old] else old


def parse_short_summary(output: str) -> dict[str, TestStatus] | None:
    """Statuses from the *last* "short test summary info" section, keyed by test id; None if there is none.

    Terminal-Bench's parser reads the lines after the header; reading the last section (and
    stopping at the next ``===`` line) keeps text a test printed earlier out of it.
    """
    text = _ANSI.sub("", output).replace("\r\n", "\n")
    headers = list(_SUMMARY_HEADER.finditer(text))
    if not headers:
        return None
    results: dict[str, TestStatus] = {}
    for line in text[headers[-1].end() :].splitlines():
        if line.startswith("="):
            break  # the final "=== 3 passed in 0.1s ===" line closes the section
        match = _SUMMARY_LINE.match(line.strip())
        if not match:
            continue
        status, rest = TestStatus(match.group(1)), match.group(2)
        # "FAILED path::test - message": the id is the first word (as SWE-bench's parser takes it).
        test_id = rest if status is TestStatus.SKIPPED else rest.split()[0]
        results[test_id] = _worst(results.get(test_id), status)
    return results


def junit_key(test_id: str) -> tuple[str, str]:
    """The (classname, name) pytest's JUnit report uses for a test id such as ``tests/test_a.py::TestA::test_b[1]``.

    This is pytest's own mapping (``mangle_test_address`` in ``_pytest/junitxml.py``): the file
    path becomes a dotted module name without ``.py``, and parameters stay on the last name.
    """
    path, bracket, params = test_id.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def _case_status(case: ET.Element) -> TestStatus:
    status = TestStatus.PASSED
    for child in case:
        if child.tag == "failure":
            new = TestStatus.FAILED
        elif child.tag == "error":
            new = TestStatus.ERROR
        elif child.tag == "skipped":
            new = TestStatus.XFAIL if child.get("type") == "pytest.xfail" else TestStatus.SKIPPED
        else:
            continue  # system-out, system-err, properties: what the test printed is not its result
        status = _worst(status, new)
    return status


class JunitError(ValueError):
    """The JUnit XML report is not one."""


def parse_junit_xml(data: bytes | str) -> dict[tuple[str, str], TestStatus]:
    """Statuses of every ``<testcase>`` in a JUnit XML report, keyed by (classname, name)."""
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise JunitError(f"not well-formed XML ({exc})") from exc
    if root.tag not in ("testsuites", "testsuite"):
        raise JunitError(f"the root element is <{root.tag}>, not <testsuites> or <testsuite>")
    results: dict[tuple[str, str], TestStatus] = {}
    for case in root.iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        results[key] = _worst(results.get(key), _case_status(case))
    return results


def status_of(test_id: str, junit: Mapping[tuple[str, str], TestStatus]) -> TestStatus | None:
    """The status of a pytest test id in a JUnit report; None when the test did not run.

    SWE-bench's test lists come from its log parser, which keeps the first word of a summary line,
    so an id whose parameters hold a space is cut there (``test_f[a`` for ``test_f[a b]``). Such an
    id stands for every test it is the prefix of, and counts as its worst outcome.
    """
    key = junit_key(test_id)
    if key in junit:
        return junit[key]
    classname, name = key
    if "[" not in name or name.endswith("]"):
        return None
    matches = [status for (cls, case), status in junit.items() if cls == classname and case.startswith(name + " ")]
    status: TestStatus | None = None
    for match in matches:
        status = _worst(status, match)
    return status
