"""What ``sandrl train CONFIG --plan`` prints: the memory plan as a table, then one JSON line.

::

    sandrl train configs/tiny.toml --plan
    sandrl train qwen3-8b.toml --plan --nproc 8 --set train.device=cuda --device-memory 80GiB

The table goes to stderr and the plan's numbers (bytes) to stdout as one JSON line, as every
command's result does (:mod:`sandrl.cli.output`). Nothing is loaded or started: the model is
counted from its config (:mod:`sandrl.train.plan`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from sandrl.cli.output import emit, rich_console

if TYPE_CHECKING:  # the train package brings in PyTorch, which `sandrl --help` should not wait for
    from sandrl.train.plan import MemoryPlan


def plan_command(config: Path, overrides: Sequence[str], *, device_memory: str | None, ray: str | None = None) -> None:
    """Plan the run of ``config`` (a ``--ray`` config's run part, with ``ray``), print it, emit its JSON."""
    from sandrl.train.plan import parse_size, plan_run

    memory = parse_size(device_memory) if device_memory is not None else None
    if ray is not None:
        from sandrl.cluster.config import load_cluster_run

        run_config, _ = load_cluster_run(config, overrides)
    else:
        from sandrl.train.run_config import load_run_config

        run_config = load_run_config(config, overrides)
    plan = plan_run(run_config, device_memory=memory)
    show_plan(plan, rich_console(wide=True))
    emit(plan.to_dict())


def show_plan(plan: MemoryPlan, console: Console) -> None:
    """The plan's terms, its total against the device's memory, and what to change when it does not fit."""
    from sandrl.train.plan import human_bytes

    title = (
        f"memory plan: {plan.model}, {plan.parameters:,} parameters ({plan.trainable:,} trained), "
        f"{plan.processes} x {plan.device}"
    )
    table = Table("per rank", "memory", "counted as", title=Text(title), title_justify="left")
    for term in plan.terms:
        table.add_row(Text(term.name), Text(human_bytes(term.bytes)), Text(term.how))
    shared = f" x {plan.ranks_per_device} ranks on this host" if plan.ranks_per_device > 1 else " per device"
    table.add_row(Text("total" + shared, style="bold"), Text(human_bytes(plan.total), style="bold"), Text(""))
    usable = f"{human_bytes(plan.usable)} usable" + (
        f" of {human_bytes(plan.device_memory)}" if plan.usable != plan.device_memory else ""
    )
    table.add_row(Text("device memory"), Text(usable), Text(plan.memory_source))
    console.print(table)
    if plan.host_offload:
        host = f"{human_bytes(plan.host_offload)} per rank in host memory"
        if plan.processes > 1:
            host += f" ({human_bytes(plan.host_offload * plan.processes)} for {plan.processes} ranks on one host)"
        console.print(Text(f"offload_optimizer keeps {host}"), soft_wrap=True)
    if plan.fits:
        console.print(
            Text(f"fits: {human_bytes(plan.total)} of {human_bytes(plan.usable)}", style="green"), soft_wrap=True
        )
        return
    console.print(
        Text(f"does not fit: {human_bytes(plan.total)} > {human_bytes(plan.usable)}", style="bold red"), soft_wrap=True
    )
    if plan.changes:
        changes = Table("change, most effective first", "total", "fits alone", title=Text("what to change"))
        for change in plan.changes:
            changes.add_row(
                Text(change.describe()), Text(human_bytes(change.total)), Text("yes" if change.fits else "no")
            )
        console.print(changes)
    console.print(Text(plan.fix()), soft_wrap=True)
