"""Reading pytest results: the short summary (Terminal-Bench) and the JUnit report (SWE-bench)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandrl.tasks.pytest_results import (
    JunitError,
    TestStatus,
    junit_key,
    parse_junit_xml,
    parse_short_summary,
    status_of,
)

SUMMARY = """\
============================= test session starts ==============================
collected 6 items

tests/test_outputs.py .F.sxX                                             [100%]

=================================== FAILURES ===================================
_________________________________ test_second __________________________________
----------------------------- Captured stdout call -----------------------------
=========================== short test summary info ============================
PASSED tests/test_outputs.py::test_second
=========================== short test summary info ============================
PASSED tests/test_outputs.py::test_first
FAILED tests/test_outputs.py::test_second - AssertionError: assert 1 == 2
PASSED tests/test_outputs.py::TestGroup::test_param[a - b]
SKIPPED [1] tests/test_outputs.py:20: no network
XFAIL tests/test_outputs.py::test_known - bug 12
XPASS tests/test_outputs.py::test_lucky
ERROR tests/test_broken.py - ImportError: no module named x
=========== 1 failed, 2 passed, 1 skipped, 1 xfailed, 1 xpassed in 0.05s ===========
PASSED tests/test_outputs.py::test_after_the_end
"""


def test_short_summary_reads_the_last_section_up_to_the_final_line() -> None:
    statuses = parse_short_summary(SUMMARY)
    assert statuses == {
        "tests/test_outputs.py::test_first": TestStatus.PASSED,
        "tests/test_outputs.py::test_second": TestStatus.FAILED,  # the printed PASSED above it is not read
        "tests/test_outputs.py::TestGroup::test_param[a": TestStatus.PASSED,  # first word, as SWE-bench reads it
        "[1] tests/test_outputs.py:20: no network": TestStatus.SKIPPED,
        "tests/test_outputs.py::test_known": TestStatus.XFAIL,
        "tests/test_outputs.py::test_lucky": TestStatus.XPASS,
        "tests/test_broken.py": TestStatus.ERROR,
    }
    assert [s.ok for s in (TestStatus.PASSED, TestStatus.XFAIL, TestStatus.SKIPPED, TestStatus.XPASS)] == [
        True,
        True,
        False,
        False,
    ]


def test_short_summary_absent_or_coloured() -> None:
    assert parse_short_summary("2 passed in 0.01s\n") is None
    coloured = "\x1b[1m==== short test summary info ====\x1b[0m\r\n\x1b[32mPASSED\x1b[0m t.py::test_a\r\n"
    assert parse_short_summary(coloured) == {"t.py::test_a": TestStatus.PASSED}


@given(
    st.dictionaries(
        st.from_regex(r"[a-z_]{1,8}\.py::test_[a-z0-9_]{1,8}", fullmatch=True),
        st.sampled_from(list(TestStatus)),
        max_size=12,
    )
)
def test_short_summary_round_trips(expected: dict[str, TestStatus]) -> None:
    lines = [
        f"{status.value} {test}" + (" - why" if status is TestStatus.FAILED else "")
        for test, status in expected.items()
    ]
    text = "noise\n===== short test summary info =====\n" + "\n".join(lines) + "\n===== 1 passed in 1s =====\n"
    assert parse_short_summary(text) == expected


def test_junit_key_is_pytests_mapping() -> None:
    assert junit_key("tests/test_a.py::test_b") == ("tests.test_a", "test_b")
    assert junit_key("tests/test_a.py::TestA::test_b[1-x::y/z]") == ("tests.test_a.TestA", "test_b[1-x::y/z]")
    assert junit_key("test_top.py::test_c") == ("test_top", "test_c")


def test_junit_keys_match_a_real_pytest_run(tmp_path: Path) -> None:
    """Every test id pytest prints maps to the testcase pytest wrote for it in the JUnit report."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "test_deep.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.mark.parametrize("v", ["a b", "x::y", "p/q", 3.5, None])
            def test_param(v):
                assert v != "p/q"

            class TestK:
                class TestInner:
                    def test_nested(self):
                        pass

                @pytest.mark.xfail(reason="known")
                def test_xfail(self):
                    assert False

                @pytest.mark.skip(reason="not here")
                def test_skip(self):
                    pass

            @pytest.fixture
            def broken():
                raise RuntimeError("setup")

            def test_error(broken):
                pass
            """
        )
    )
    (tmp_path / "test_top.py").write_text("def test_top():\n    print('PASSED pkg/sub/test_deep.py::test_error')\n")
    junit = tmp_path / "report.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", f"--junitxml={junit}", "-o", "addopts="],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    printed = parse_short_summary(done.stdout)
    assert printed is not None and len(printed) == 10, done.stdout
    report = parse_junit_xml(junit.read_bytes())
    for test_id, status in printed.items():
        if status is TestStatus.SKIPPED:
            continue  # the summary names a skip by file and line, not by test id
        assert status_of(test_id, report) is status, test_id
    assert status_of("pkg/sub/test_deep.py::test_param[p/q]", report) is TestStatus.FAILED
    assert status_of("pkg/sub/test_deep.py::TestK::test_skip", report) is TestStatus.SKIPPED
    assert status_of("pkg/sub/test_deep.py::TestK::test_xfail", report) is TestStatus.XFAIL
    assert status_of("pkg/sub/test_deep.py::test_error", report) is TestStatus.ERROR  # what test_top printed is ignored
    assert status_of("pkg/sub/test_deep.py::test_absent", report) is None
    # The first-word form of an id with a space (as SWE-bench's lists hold it) still finds its test.
    assert status_of("pkg/sub/test_deep.py::test_param[a", report) is TestStatus.PASSED
    assert status_of("pkg/sub/test_deep.py::test_param[a b]", report) is TestStatus.PASSED
    assert status_of("pkg/sub/test_deep.py::test_param[z", report) is None


def test_junit_worst_outcome_wins_and_bad_reports_are_refused() -> None:
    xml = """<testsuites><testsuite>
      <testcase classname="t" name="a"><system-out>PASSED</system-out></testcase>
      <testcase classname="t" name="b"><failure message="x"/><error message="teardown"/></testcase>
      <testcase classname="t" name="c"/><testcase classname="t" name="c"><failure/></testcase>
      <testcase classname="t" name="d"><skipped type="pytest.skip"/></testcase>
    </testsuite></testsuites>"""
    assert parse_junit_xml(xml) == {
        ("t", "a"): TestStatus.PASSED,
        ("t", "b"): TestStatus.ERROR,
        ("t", "c"): TestStatus.FAILED,
        ("t", "d"): TestStatus.SKIPPED,
    }
    with pytest.raises(JunitError, match="not well-formed"):
        parse_junit_xml(b"<testsuites>")
    with pytest.raises(JunitError, match="root element is <html>"):
        parse_junit_xml(b"<html/>")
