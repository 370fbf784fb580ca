"""Benchmarks. Each prints a table for people, then one JSON line for scripts."""
