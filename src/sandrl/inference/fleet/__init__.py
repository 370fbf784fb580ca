"""Inference engines that sandrl launches and routes to (``[inference]`` of a run).

- :mod:`~sandrl.inference.fleet.config`: the ``[inference]`` section (``launch``, ``engines``,
  ``gpus_per_engine``, ``args``...).
- :mod:`~sandrl.inference.fleet.commands`: each engine's command line (sandrl's embedded server,
  SGLang, vLLM) and its share of the GPUs.
- :mod:`~sandrl.inference.fleet.guard`: the watchdog process between the driver and an engine,
  so no engine outlives the driver (``kill -9`` included).
- :mod:`~sandrl.inference.fleet.launch`: starting the engines, waiting for them, restarting one
  that dies (bounded, with backoff), stopping them all.
- :mod:`~sandrl.inference.fleet.affinity`: the episode a call belongs to (a routing key).
- :mod:`~sandrl.inference.fleet.router` and :mod:`~sandrl.inference.fleet.proxy`: one URL in front
  of the engines, each episode pinned to one engine, new episodes to the least loaded;
  :mod:`~sandrl.inference.fleet.forward`: the router's kept-alive connections for generation calls.
- :mod:`~sandrl.inference.fleet.serve`: all of it together (:func:`open_fleet`).

This package imports nothing heavy at import time: the transport imports its affinity module.
"""
