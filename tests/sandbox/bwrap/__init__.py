"""Tests of the bubblewrap backend (sandrl.sandbox.bwrap): real sandboxes on this host."""
