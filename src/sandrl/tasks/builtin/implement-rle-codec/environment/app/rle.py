"""Run-length encoding: "aaab" <-> "3a1b"."""


def encode(text: str) -> str:
    raise NotImplementedError


def decode(data: str) -> str:
    raise NotImplementedError
