"""sandrl.progress: the bars of long work, and the plain lines they become in a log."""

from __future__ import annotations

import io
import re
import time

from rich.console import Console

from sandrl.progress import Progress, duration, plain_line


def log_console() -> tuple[Console, io.StringIO]:
    """A console writing to a file, as stderr piped into a log is."""
    buffer = io.StringIO()
    return Console(file=buffer, width=200), buffer


def test_a_line_says_what_how_far_how_fast_and_how_long_still() -> None:
    with Progress(console=log_console()[0], every=3600) as progress:
        counted = progress.add_task("episodes", total=40, detail="passed=3")
        progress.advance(counted, 10)
        blocked = progress.add_task("step 5/36 training: 16 samples", total=None)
        pulled = progress.add_task("layer 0123", total=40_000_000, unit="bytes")
        progress.advance(pulled, 10_000_000)
        time.sleep(0.05)
        by_id = {t.id: t for t in progress.tasks}
        line = plain_line(by_id[counted])
        assert re.fullmatch(r"episodes: 10/40  \d+\.\d\d/s  ETA \d+s  passed=3", line), line
        assert re.fullmatch(r"step 5/36 training: 16 samples  0s", plain_line(by_id[blocked]))
        assert re.fullmatch(r"layer 0123: 10\.0 MB/40\.0 MB  [\d.]+ [kMG]B/s  ETA \d+s", plain_line(by_id[pulled]))


def test_durations_stay_short() -> None:
    assert [duration(s) for s in (0.4, 59.6, 185, 7625)] == ["0s", "1m00s", "3m05s", "2h07m"]


def test_in_a_log_a_bar_is_a_line_every_few_seconds_while_the_work_lasts() -> None:
    console, log = log_console()
    with Progress(console=console, every=0.05) as progress:
        bar = progress.add_task("episodes", total=4)
        for _ in range(3):
            progress.advance(bar)
            time.sleep(0.12)
    lines = log.getvalue().splitlines()
    assert len(lines) >= 4 and all(line.startswith("episodes: ") for line in lines), lines
    assert lines[-1].startswith("episodes: 3/4"), lines
    time.sleep(0.15)
    assert log.getvalue().splitlines() == lines  # stopped: no more lines


def test_work_shorter_than_the_interval_prints_nothing_in_a_log() -> None:
    console, log = log_console()
    with Progress(console=console, every=30) as progress:
        progress.advance(progress.add_task("episodes", total=2), 2)
    assert log.getvalue() == ""  # rich's own Progress ended with a blank line here


def test_on_a_terminal_rich_draws_the_bar_and_no_line_is_printed() -> None:
    buffer = io.StringIO()
    terminal = Console(file=buffer, force_terminal=True, force_interactive=True, width=120)
    with Progress(console=terminal, every=0.02) as progress:
        assert progress.draws
        progress.add_task("episodes [x]", total=2, detail="[red]not markup[/]")
        time.sleep(0.15)
    drawn = buffer.getvalue()
    assert "episodes [x]" in drawn and "[red]not markup[/]" in drawn  # text as written, never markup
    assert "episodes [x]: " not in drawn  # the plain line's shape
