"""The E2B backend: sandboxes of any E2B-compatible service (E2B itself, or a sandrl host's
``sandrl serve sandboxes``), through the official ``e2b`` SDK.

:class:`~sandrl.sandbox.e2b.provider.E2BProvider` and its sandboxes and config (:mod:`.provider`),
the SDK's failures as sandrl's typed errors (:mod:`.errors`), and the template an image has on
such a service (:mod:`.templates`).

Nothing is imported here, so that naming a template (:mod:`.templates`) loads no ``e2b`` SDK.
"""
