"""Isolated Linux sandboxes, in layers.

- :mod:`.base`: the interfaces every caller codes against (:class:`SandboxSpec`, :class:`Sandbox`,
  :class:`SandboxProvider`, :class:`ImageSource`...); :mod:`.delegating`: the base of sandbox
  wrappers;
- :mod:`.bwrap`: the bubblewrap backend (provider, live sandboxes, image store and builder);
- :mod:`.service`: the HTTP service over any provider (sandrl's API and E2B's), and
  :mod:`.client`, its client as a provider;
- :mod:`.pool`: warm pools and command admission over a provider.
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
