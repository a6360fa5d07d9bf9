"""`mlxcel stats`: headless dumps of a running server or of a short local run."""

from __future__ import annotations

import json
import sys
import time

import click

from prometheus_client.parser import text_string_to_metric_families

from .frame import EXTRA_BLAS
from .options import CliError, cascade_options, debug_option, model_options, parallel_options
from .source import HttpSource, SourceError, samples_dict
from .workload import (build_engine, check_ranks, follow_as_rank, join_ranks, served_model, start_sessions,
                       system_prompt_text)


def snapshot_summary(snap: dict) -> dict:
    """The operator's view of one snapshot: pool, sharing, prefix cache, plan, latency."""
    pool = snap["pool"]
    pages = sum(len(s["pages"]) for s in snap["sequences"])
    return {
        "step": snap["step"],
        "model": snap["model"],
        "device": snap["device"],
        "blas": snap.get("extra", {}).get(EXTRA_BLAS),
        "sequences": len(snap["sequences"]),
        "waiting": snap["waiting"],
        "pool_blocks": pool["num_blocks"],
        "pool_blocks_used": pool["live"],
        "pool_blocks_shared": pool["shared"],
        "pool_blocks_reusable": pool["reusable"],
        # Storage figure: blocks the live page tables name, against what one
        # private copy per sequence would take.
        "page_table_entries": pages,
        "blocks_saved_by_sharing": pages - pool["live"] if pages else 0,
        "prefix_cache": snap["prefix_cache"],
        "cascade": snap["cascade"],
        "last_plan": snap["plan"],
        "decline_reason": snap["decline_reason"],
        "last_path": snap["last_path"],
        "step_latency_p50_ms": _ms(snap["latency_p50_seconds"]),
        "step_latency_p99_ms": _ms(snap["latency_p99_seconds"]),
        # Who sets the pace: the engine's host work per step, or MLX's (the device's) share.
        "step_host_p50_ms": _ms(snap.get("host_p50_seconds")),
        "step_device_p50_ms": _ms(snap.get("device_p50_seconds")),
        "tokens_per_second": round(snap["tokens_per_second"], 2),
        "tensor_parallel": snap.get("tensor_parallel"),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


def render_table(samples: dict[str, float], summary: dict, sessions: list[dict] | None = None) -> str:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=None, width=100, record=True, force_terminal=False)
    overview = Table(title=f"mlxcel · {summary['model']} on {summary['device']} · step {summary['step']}",
                     show_header=False, title_justify="left")
    overview.add_column(style="bold")
    overview.add_column()
    for key, value in summary.items():
        if key not in ("model", "device", "step"):
            overview.add_row(key, json.dumps(value) if isinstance(value, (dict, list)) else str(value))
    metrics = Table(title="metrics", title_justify="left")
    metrics.add_column("sample")
    metrics.add_column("value", justify="right")
    for key, value in sorted(samples.items()):
        name = key.split("{", 1)[0]
        if name.startswith("mlxcel_") and not name.endswith(("_bucket", "_created")):
            metrics.add_row(key, f"{value:g}")
    with console.capture() as capture:
        console.print(overview)
        console.print(metrics)
        if sessions:
            table = Table(title="sessions", title_justify="left")
            for col in ("session", "turns", "tokens generated", "latest question", "latest answer"):
                table.add_column(col)
            for s in sessions:
                table.add_row(s["label"], str(len(s["completions"])), str(sum(map(len, s["completions"]))),
                              s["question"], s["answer"])
            console.print(table)
    return capture.get()


def emit(fmt: str, samples: dict, snap: dict, prometheus_text: str,
         sessions: list[dict] | None = None) -> None:
    summary = snapshot_summary(snap)
    if fmt == "prometheus":
        click.echo(prometheus_text, nl=False)
    elif fmt == "json":
        out = dict(samples)
        out["snapshot"] = summary
        if sessions is not None:
            out["sessions"] = sessions
        click.echo(json.dumps(out, indent=2))
    else:
        click.echo(render_table(samples, summary, sessions), nl=False)


def read_server(source: HttpSource):
    text = source.metrics_text()
    return samples_dict(text_string_to_metric_families(text)), source.snapshot(), text


def run_workload(model, sessions, shared_prefix_tokens, max_tokens, turns, cascade, min_shared_pages,
                 min_members, kv_blocks, dtype="auto", ranks=None):
    """Run N sessions for a few turns on this thread; returns (engine, sessions, peak snapshot)."""
    from .progress import StderrProgress

    model, notice = served_model(model)
    if notice:
        click.echo(f"mlxcel: {notice}", err=True)
    engine = build_engine(model, cascade, min_shared_pages, min_members, kv_blocks, dtype=dtype,
                          progress=StderrProgress(), ranks=ranks)
    prompt = system_prompt_text(engine, None, shared_prefix_tokens)
    manager = start_sessions(engine, sessions, prompt, max_tokens, turns=turns)
    total = sessions * turns * max_tokens
    peak = engine.snapshot
    interactive = sys.stderr.isatty()
    bar = click.progressbar(length=total, label="generating", file=sys.stderr) if interactive else None
    done, last_note = 0, time.monotonic()
    while engine.step():
        snap = engine.snapshot
        if len(snap.sequences) >= len(peak.sequences):
            peak = snap
        now_done = sum(len(c) for s in manager.sessions for c in s.completions) + sum(
            s.current.num_completion_tokens for s in manager.sessions if s.current)
        if bar:
            bar.update(now_done - done)
        elif time.monotonic() - last_note > 5:
            click.echo(f"mlxcel stats: {now_done}/{total} tokens, step {snap.step}", err=True)
            last_note = time.monotonic()
        done = now_done
    if bar:
        bar.finish()
        click.echo("", err=True)
    return engine, manager, peak


@click.command()
@click.option("--url", default=None, help="Read a running server (its /metrics and /v1/cascade).")
@click.option("--run", "run_model", is_flag=False, flag_value="", default=None, metavar="[MODEL]",
              help="Run a short session workload headless (default model unless MODEL is given).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "prometheus"]), default="table",
              show_default=True)
@click.option("--watch", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="With --url: repeat every SECONDS until interrupted.")
@click.option("--api-key", envvar="MLXCEL_API_KEY", default=None, help="Bearer token for --url.")
@click.option("--sessions", type=click.IntRange(1, 1024), default=4, show_default=True)
@click.option("--shared-prefix-tokens", type=click.IntRange(1, 1_000_000), default=None)
@click.option("--max-tokens", type=click.IntRange(1, 8192), default=32, show_default=True)
@click.option("--turns", type=click.IntRange(1, 1000), default=1, show_default=True,
              help="Questions each session asks in --run.")
@click.option("--kv-blocks", type=click.IntRange(1), default=None, help="KV pool size in blocks for --run.")
@cascade_options
@model_options
@parallel_options
@debug_option
def stats(url, run_model, fmt, watch, api_key, sessions, shared_prefix_tokens, max_tokens, turns, kv_blocks,
          cascade, min_shared_pages, min_members, dtype, tensor_parallel, backend, debug):
    """Dump engine metrics and a snapshot summary, from --url or a --run."""
    if (url is None) == (run_model is None):
        raise click.UsageError("give exactly one of --url URL or --run [MODEL]")
    if watch is not None and url is None:
        raise click.UsageError("--watch needs --url")
    if tensor_parallel is not None and url is not None:
        raise click.UsageError("--tensor-parallel goes with --run")
    if url is not None:
        source = HttpSource(url, api_key)
        try:
            while True:
                samples, snap, text = read_server(source)
                emit(fmt, samples, snap, text)
                if watch is None:
                    return
                time.sleep(watch)
        except SourceError as err:
            raise CliError(str(err)) from None
        except KeyboardInterrupt:
            return
    from prometheus_client import generate_latest

    from .source import EngineSource

    ranks = join_ranks(tensor_parallel, backend)
    if ranks is None and tensor_parallel is not None:
        from .launch import launch_ranks

        check_ranks(run_model or None, dtype, tensor_parallel)
        return launch_ranks("mlxcel", sys.argv[1:], tensor_parallel, backend)
    if ranks is not None and not ranks.is_leader:
        return follow_as_rank(run_model or None, dtype, ranks)
    engine, manager, peak = run_workload(run_model or None, sessions, shared_prefix_tokens, max_tokens, turns,
                                         cascade, min_shared_pages, min_members, kv_blocks, dtype, ranks)
    source = EngineSource(engine, manager)
    summary_snap = source.snapshot()
    # The storage figure is read at the busiest step: at the end every page is released.
    summary_snap["sequences"] = peak.to_dict()["sequences"]
    summary_snap["pool"] = {**summary_snap["pool"], "live": peak.pool.live, "shared": peak.pool.shared}
    per_session = [{**s.as_dict(), "completions": s.completions} for s in manager.sessions]
    emit(fmt, source.metrics(), summary_snap, generate_latest(engine.metrics.registry).decode(),
         per_session)
    engine.shutdown()   # under tensor parallelism: the other ranks stop
