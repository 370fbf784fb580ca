"""Roman numerals for the numbers 1..3999."""


def to_roman(n: int) -> str:
    """The canonical Roman numeral of ``n`` (1..3999); ValueError otherwise."""
    raise NotImplementedError


def from_roman(s: str) -> int:
    """The value of the canonical Roman numeral ``s``; ValueError for anything else."""
    raise NotImplementedError
