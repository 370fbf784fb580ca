"""Greedy word wrapping and full justification."""


def wrap(text, width):
    raise NotImplementedError


def justify(text, width):
    raise NotImplementedError
