"""Tests of the remote client (sandrl.sandbox.remote) on its own; with a real server they are in ``service/``."""
