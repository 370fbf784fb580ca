"""Semantic Versioning 2.0.0: parsing and precedence."""


def parse(text):
    """(major, minor, patch, prerelease identifiers, build identifiers); ValueError if invalid."""
    raise NotImplementedError


def compare(a, b):
    """-1, 0 or 1: the precedence of version string ``a`` relative to ``b``."""
    raise NotImplementedError


def sort_versions(versions):
    """The version strings sorted by precedence, ascending."""
    raise NotImplementedError
