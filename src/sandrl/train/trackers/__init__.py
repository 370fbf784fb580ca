"""Experiment trackers: each step's metrics, the resolved config and a few sample episodes, sent to
TensorBoard, Weights & Biases or MLflow besides ``metrics.jsonl`` (``[run] trackers``).

- :mod:`.names`: the tracker names a config may list, and the load-time check of them;
- :mod:`.base`: what a tracker is, and the step's record made flat numbers;
- :mod:`.episodes`: the sample episodes of a step, bounded (sandbox output is hostile);
- :mod:`.fanout`: :func:`~.fanout.open_trackers` and :class:`~.fanout.Trackers`, which sends to each
  and drops, with one line on the console, a tracker that fails;
- one module per tracker: :mod:`.tensorboard_tracker`, :mod:`.wandb_tracker`, :mod:`.mlflow_tracker`
  (each imports its library only when opened).
"""
