"""Scale-out: many sandbox hosts, rollout workers and the trainer on a Ray cluster.

- :mod:`sandrl.cluster.hosts`: a sandbox host, its capacity (configured or from a contention result), its counters;
- :mod:`sandrl.cluster.fleet`: :class:`~sandrl.cluster.fleet.FleetProvider`, one SandboxProvider over the hosts;
- :mod:`sandrl.cluster.engines`: the inference engines as Ray actors in a placement group, behind the driver's router;
- :mod:`sandrl.cluster.config`: the ``[cluster]`` section of a run config;
- :mod:`sandrl.cluster.worker`: a rollout worker (the body of its Ray actor);
- :mod:`sandrl.cluster.ledger`: exactly-once accounting of episodes;
- :mod:`sandrl.cluster.ray`, :mod:`sandrl.cluster.dispatch`: the actors, and the driver's side of them;
- :mod:`sandrl.cluster.training`: ``sandrl train --ray``.

Only ``ray``, ``dispatch``, ``engines`` and what calls them import Ray (the ``cluster`` extra); the fleet
works without it.
"""
