"""The remote backend: sandboxes of a sandrl host's sandbox service (``sandrl serve sandboxes``), over its native API.

:class:`~sandrl.sandbox.remote.provider.RemoteProvider` and its sandboxes (:mod:`.provider`), its
settings (:mod:`.config`), the service's error answers as typed errors (:mod:`.errors`), the
transports under it (the call channel, :mod:`.call_channel`, and an HTTP/1.1 pool,
:mod:`.http_pool`), and the wire it shares with the server: the API's bodies (:mod:`.wire`) and
the call channel's framing (:mod:`.frames`). No module here imports the server
(:mod:`sandrl.sandbox.service` imports these, never the other way), and nothing is imported
here, so that the server importing the wire loads no client.
"""
