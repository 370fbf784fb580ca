"""``python -m sandrl.cli``: the same command as the ``sandrl`` console script."""

from sandrl.cli import main

main()
