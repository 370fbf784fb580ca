"""``sandrl view``: a run's page, built from what the run wrote, while it runs and after.

- :mod:`.episode_index`: where each episode of ``rollouts.jsonl`` is, and what it says in brief;
- :mod:`.run_files`: what a run directory holds (a training run's, an eval's), read as it grows;
- :mod:`.summary`: the curves, the tasks and task sources, the episode filters;
- :mod:`.episode_page`: one episode turn by turn, its text bounded and escaped;
- :mod:`.run_view`: all of it for one run, behind one lock;
- :mod:`.app`: the web app on loopback; :mod:`.report_file`: the page as one file (``--out``);
- ``assets/``: the page, its script and its style.
"""
