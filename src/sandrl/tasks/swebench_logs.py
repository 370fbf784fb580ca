"""Per-test results from the logs of Django's and SymPy's test runners, read as the SWE-bench harness
reads them (``swebench.harness.log_parsers.python``: ``parse_log_django``, ``parse_log_sympy``).

Test ids are the harness's, so they match an instance's FAIL_TO_PASS and PASS_TO_PASS lists:
Django's ``test_name (module.Class)``, SymPy's ``test_name``. Where one test is reported twice the
later line wins, as in the harness. These parsers read printed text, so like the harness's they
believe a test that prints a result line; pytest-based repositories are graded from pytest's
JUnit report instead (:mod:`sandrl.tasks.pytest_results`).
"""

from __future__ import annotations

import re

from sandrl.tasks.pytest_results import TestStatus

_DJANGO_PASS_SUFFIXES = (" ... ok", " ... OK", " ...  OK")
# A long message Django prints can split "<test> ... " from its "ok" (the harness's three known shapes).
_DJANGO_SPLIT_PASS = (
    re.compile(r"^(.*?)\s\.\.\.\sTesting\ against\ Django\ installed\ in\ ((?s:.*?))\ silenced\)\.\nok$", re.MULTILINE),
    re.compile(r"^(.*?)\s\.\.\.\sInternal\ Server\ Error:\ \/(.*)\/\nok$", re.MULTILINE),
    re.compile(r"^(.*?)\s\.\.\.\sSystem check identified no issues \(0 silenced\)\nok$", re.MULTILINE),
)
_SYMPY_FAILURE_HEADER = re.compile(r"(_*) (.*)\.py:(.*) (_*)")


def parse_django_log(log: str) -> dict[str, TestStatus]:
    """Statuses from ``runtests.py --verbosity 2`` output: ``test_x (app.tests.T) ... ok``, ``FAIL: ...``."""
    results: dict[str, TestStatus] = {}
    previous: str | None = None
    for raw in log.split("\n"):
        line = raw.strip()
        if "--version is equivalent to version" in line:
            results["--version is equivalent to version"] = TestStatus.PASSED
        if " ... " in line:
            previous = line.split(" ... ")[0]
        for suffix in _DJANGO_PASS_SUFFIXES:
            if line.endswith(suffix):
                if line.startswith("Applying sites.0002_alter_domain_unique...test_no_migrations"):
                    line = line.split("...", 1)[-1].strip()  # the harness's fix for django__django-7188
                results[line.rsplit(suffix, 1)[0]] = TestStatus.PASSED
                break
        if " ... skipped" in line:
            results[line.split(" ... skipped")[0]] = TestStatus.SKIPPED
        if line.endswith(" ... FAIL"):
            results[line.split(" ... FAIL")[0]] = TestStatus.FAILED
        if line.startswith("FAIL:") and len(line.split()) > 1:
            results[line.split()[1].strip()] = TestStatus.FAILED
        if line.endswith(" ... ERROR"):
            results[line.split(" ... ERROR")[0]] = TestStatus.ERROR
        if line.startswith("ERROR:") and len(line.split()) > 1:
            results[line.split()[1].strip()] = TestStatus.ERROR
        if line.lstrip().startswith("ok") and previous is not None:
            results[previous] = TestStatus.PASSED  # output between "..." and "ok"
    for pattern in _DJANGO_SPLIT_PASS:
        for match in pattern.finditer(log):
            results[match.group(1)] = TestStatus.PASSED
    return results


def parse_sympy_log(log: str) -> dict[str, TestStatus]:
    """Statuses from ``bin/test -C --verbose`` output: ``test_x ok`` / ``F`` / ``E`` lines, and the
    ``___ path.py:test_x ___`` headers of the failure report."""
    results: dict[str, TestStatus] = {}
    for match in _SYMPY_FAILURE_HEADER.findall(log):
        results[f"{match[1]}.py:{match[2]}"] = TestStatus.FAILED
    for raw in log.split("\n"):
        line = raw.strip()
        if not line.startswith("test_"):
            continue
        name = line.split()[0]
        if line.endswith(" E"):
            results[name] = TestStatus.ERROR
        if line.endswith(" F"):
            results[name] = TestStatus.FAILED
        if line.endswith(" ok"):
            results[name] = TestStatus.PASSED
    return results
