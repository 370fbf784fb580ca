"""Isolated Linux sandboxes: the protocols every backend meets, and one package per backend.

- :mod:`.base`: the interfaces every caller codes against (:class:`SandboxSpec`, :class:`Sandbox`,
  :class:`SandboxProvider`, :class:`ImageSource`...); :mod:`.delegating`: the base of sandbox
  wrappers; :mod:`.admission`: host-capacity admission of commands over any provider;
- :mod:`.bwrap`: the bubblewrap backend (provider, live sandboxes, image store and builder, warm pool);
- :mod:`.remote`: a sandrl host's sandbox service as a provider (its client, and the wire it
  shares with the server); :mod:`.service`: that HTTP service, over any provider (sandrl's API and E2B's);
- :mod:`.e2b`: any E2B-compatible service as a provider, through the ``e2b`` SDK.
"""

from sandrl.sandbox.base import (
    ExecResult,
    ImageSource,
    OutputChunk,
    Sandbox,
    SandboxProcess,
    SandboxProvider,
    SandboxSpec,
)

__all__ = ["ExecResult", "ImageSource", "OutputChunk", "Sandbox", "SandboxProcess", "SandboxProvider", "SandboxSpec"]
