"""``sandrl serve sandboxes|inference``: the HTTP servers, each run in the foreground until stopped."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import typer

from sandrl.errors import ConfigError

if TYPE_CHECKING:
    from sandrl.inference.base import UpdatePolicy

app = typer.Typer(no_args_is_help=True, help="Servers: sandboxes, inference.")


@app.command("sandboxes")
def serve_sandboxes(
    host: str = typer.Option("127.0.0.1", help="Address to bind (without a token: loopback only)."),
    port: int = typer.Option(8700, help="Port to bind."),
    token_file: str | None = typer.Option(None, help="File holding the bearer token (or set $SANDRL_TOKEN)."),
    max_live: int | None = typer.Option(None, help="Most live sandboxes; further creates get capacity_exhausted."),
    state_dir: str | None = typer.Option(
        None, help="State directory (default $SANDRL_STATE_DIR, else /var/lib/sandrl)."
    ),
    egress_allow: list[str] | None = typer.Option(
        None,
        help="A private range (CIDR) that sandboxes with the network may reach; repeat for more "
        "(default $SANDRL_EGRESS_ALLOW, else none). Loopback and link-local never.",
    ),
) -> None:
    """Serve sandboxes over HTTP: the native /v1 API, Prometheus /metrics."""
    from sandrl.sandbox.service.server import serve

    serve(host, port, token_file=token_file, max_live=max_live, state_dir=state_dir, egress_allow=egress_allow)


@app.command("inference")
def serve_inference(
    model: str = typer.Option("tiny", help="'tiny' (built from a config) or a local Hugging Face checkpoint dir."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (without a token: loopback only)."),
    port: int = typer.Option(30000, help="Port to bind."),
    token_file: str | None = typer.Option(
        None,
        help="File holding the bearer token (or set $SANDRL_INFERENCE_TOKEN). Without one: loopback callers only, "
        "and the control routes (weights, LoRA adapters, pause, flush, abort) refused.",
    ),
    max_body_mb: float = typer.Option(16.0, help="Largest request body, MiB; larger ones are refused (413)."),
    max_batch_size: int = typer.Option(64, help="Most requests decoded together."),
    seed: int = typer.Option(0, help="Seed of the tiny model's weights and of sampling."),
    update_policy: str = typer.Option(
        "pause",
        help="What a weight update does to requests in flight: pause (they finish on the old weights; SGLang's "
        "default), in_place (they go on with the new ones) or abort_and_resume (they resume from their tokens).",
    ),
    tool_parser: str | None = typer.Option(
        None, help="The session gateway's tool-call parser: hermes, glm45, llama3_json (default: from the template)."
    ),
    max_loaded_loras: int = typer.Option(
        8, help="Most LoRA adapters loaded at once (/load_lora_adapter), as SGLang's --max-loaded-loras."
    ),
    max_lora_rank: int = typer.Option(256, help="Largest rank of a LoRA adapter the server loads."),
    prefix_cache_tokens: int = typer.Option(
        32768,
        help="Tokens of finished sequences whose KV is kept for requests that extend them (the next turn of an "
        "episode; SGLang's radix cache), least recently used evicted first; 0 turns the cache off.",
    ),
    kv_cache_tokens: int = typer.Option(
        0,
        help="Tokens the running requests' KV cache may hold (SGLang's --max-total-tokens): requests wait while "
        "theirs do not fit, the newest are retracted when decoding runs out of room; 0: no bound.",
    ),
) -> None:
    """Serve the embedded CPU engine with SGLang's and OpenAI's routes and the session gateway (/v1/sessions)."""
    from sandrl.inference.base import UPDATE_POLICIES
    from sandrl.inference.engine import EngineConfig
    from sandrl.inference.server import serve

    if update_policy not in UPDATE_POLICIES:
        raise ConfigError(f"--update-policy must be one of {', '.join(UPDATE_POLICIES)}, got {update_policy!r}")
    if not max_body_mb > 0:
        raise ConfigError(f"--max-body-mb must be positive, got {max_body_mb}")
    policy = cast("UpdatePolicy", update_policy)
    if tool_parser is not None:
        from sandrl.inference.toolcalls import get_parser

        get_parser(tool_parser)  # an unknown name fails before the model loads
    serve(
        model,
        host,
        port,
        engine_config=EngineConfig(
            max_batch_size=max_batch_size,
            seed=seed,
            max_loras=max_loaded_loras,
            max_lora_rank=max_lora_rank,
            prefix_cache_tokens=prefix_cache_tokens,
            kv_cache_tokens=kv_cache_tokens,
        ),
        update_policy=policy,
        tool_parser=tool_parser,
        token_file=token_file,
        max_body_bytes=int(max_body_mb * 2**20),
    )
