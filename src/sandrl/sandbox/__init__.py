"""Isolated Linux sandboxes: the interfaces, the bubblewrap backend, images and the warm pool."""

from sandrl.sandbox.base import ExecResult, OutputChunk, Sandbox, SandboxProcess, SandboxProvider, SandboxSpec

__all__ = ["ExecResult", "OutputChunk", "Sandbox", "SandboxProcess", "SandboxProvider", "SandboxSpec"]
