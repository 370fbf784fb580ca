"""Harbor environments on sandrl sandboxes (``sandrl serve sandboxes``, over its native HTTP API).

::

    harbor trial start -p TASK -a oracle -e sandrl_harbor:SandrlEnvironment --ek url=http://host:8700

The token comes from ``$SANDRL_TOKEN`` or ``--ek token_file=PATH``; see :mod:`sandrl_harbor.environment`.
"""

from sandrl_harbor.environment import SandrlEnvironment, SandrlOptions

__all__ = ["SandrlEnvironment", "SandrlOptions"]
