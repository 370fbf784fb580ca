"""C sources of the sandbox helper (package data)."""
