"""Images without Docker: a Dockerfile subset built in the backend's own sandboxes, layer by layer.

:mod:`sandrl.images.dockerfile` reads a Dockerfile as Docker does; :mod:`.builder` runs it step by step
(:class:`~.builder.ImageBuilder`, with Docker's layer cache) and names what it makes (:mod:`.names`:
``build-<key>`` for the cache, ``task-<task>-<key>`` for a task's image); :mod:`.context_copy` is ``COPY``
and ``ADD`` of build-context files; :mod:`.source` makes an
:class:`~sandrl.sandbox.base.ImageSource` into a store image, the bubblewrap provider's
``resolve_image``.
"""
