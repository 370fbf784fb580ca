"""Benchmarks. Each prints a table for people, then one JSON line for scripts.

Every ``sandrl bench`` command's code is here, and this package is a leaf: it imports the
runtime, nothing but the CLI imports it. What the runtime shares with it sits below:
:mod:`sandrl.stats`, :mod:`sandrl.capacity` and :mod:`sandrl.result_file`.
"""
