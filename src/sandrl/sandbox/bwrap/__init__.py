"""The bubblewrap backend: sandboxes as namespaces over an idmapped copy-on-write root, with cgroup limits.

:class:`BwrapProvider` (:mod:`.provider`, which also states the threat model) makes
:class:`BwrapSandbox` es (:mod:`.sandbox`). Beneath them: the wire protocol to each sandbox's
pid 1 (:mod:`.protocol`), the native helper that sets a sandbox up (:mod:`.helper_build` builds it from
``native/sandrl-helper.c``), uid slots and records (:mod:`.state`), cgroups (:mod:`.cgroups`),
the image store and its layers (:mod:`.images`, :mod:`.host_views`, :mod:`.layer_owners`) and
the export of a sandbox's changes as a layer (:mod:`.export`).
"""

from sandrl.sandbox.bwrap.provider import BwrapProvider
from sandrl.sandbox.bwrap.sandbox import BwrapSandbox

__all__ = ["BwrapProvider", "BwrapSandbox"]
