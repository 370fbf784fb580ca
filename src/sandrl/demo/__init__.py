"""``sandrl demo``: the main job end to end on the embedded defaults.

``learn`` (the default) trains a tiny policy with GRPO against real sandboxes and shows it
learned (:mod:`sandrl.demo.learn`); ``sandbox`` shows one sandbox's commands, files and
enforced limits (:mod:`sandrl.demo.sandbox`). ``sandrl bench train --estimators`` runs the first once
per loss and seed (:mod:`sandrl.demo.estimators`).
"""
