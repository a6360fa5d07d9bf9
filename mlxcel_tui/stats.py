"""`mlxcel stats`: headless dumps of a running server or of a short local run."""

from __future__ import annotations

import json
import sys
import time

import click

from prometheus_client.parser import text_string_to_metric_families

from .frame import EXTRA_BLAS, page_gain
from .options import CliError, cascade_options, debug_option, kv_dtype_option, model_options, parallel_options
from .source import HttpSource, SourceError, sample_key
from .workload import (build_engine, check_ranks, follow_as_rank, join_ranks, served_model, start_sessions,
                       system_prompt_text)


MIB = 1 << 20


def snapshot_summary(snap: dict) -> dict:
    """The operator's view of one snapshot: pool, sharing, prefix cache, plan,
    latency; figures in the units their keys name, no block-id lists."""
    pool = snap["pool"]
    pages = sum(len(s["pages"]) for s in snap["sequences"])
    plan = snap["plan"]
    extra = snap.get("extra", {})
    return {
        "step": snap["step"],
        "model": snap["model"],
        "device": snap["device"],
        "blas": extra.get(EXTRA_BLAS),
        "running": snap["running"],
        "waiting": snap["waiting"],
        "pool_blocks": pool["num_blocks"],
        "pool_blocks_used": pool["live"],
        "pool_blocks_shared": pool["shared"],
        "pool_blocks_reusable": pool["reusable"],
        "pool_block_bytes": pool["bytes_per_block"],
        # The page format, and the pages it gains over the model's own dtype in the same bytes.
        "kv_dtype": pool.get("kv_dtype"),
        "model_dtype": pool.get("model_dtype"),
        "model_dtype_block_bytes": pool.get("model_dtype_bytes_per_block"),
        "pages_vs_model_dtype": page_gain(pool),
        # Storage figure: blocks the live page tables name, against what one
        # private copy per sequence would take.
        "page_table_entries": pages,
        "blocks_saved_by_sharing": pages - pool["live"] if pages else 0,
        "prefix_cache": snap["prefix_cache"],
        "cascade": snap["cascade"],
        "last_plan": None if plan is None else {"members": len(plan["members"]), "shared_pages": plan["shared_pages"],
                                                "shared_tokens": plan["shared_tokens"]},
        "decline_reason": snap["decline_reason"],
        "last_path": snap["last_path"],
        "step_latency_p50_ms": _ms(snap["latency_p50_seconds"]),
        "step_latency_p99_ms": _ms(snap["latency_p99_seconds"]),
        # Who sets the pace: the engine's host work per step, or MLX's (the device's) share.
        "step_host_p50_ms": _ms(snap.get("host_p50_seconds")),
        "step_device_p50_ms": _ms(snap.get("device_p50_seconds")),
        "tokens_per_second": round(snap["tokens_per_second"], 2),
        "process_rss_bytes": extra.get("process_rss_bytes"),
        "mlx_active_memory_bytes": extra.get("mlx_active_memory_bytes"),
        "mlx_cache_memory_bytes": extra.get("mlx_cache_memory_bytes"),
        "tensor_parallel": snap.get("tensor_parallel"),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


def metric_records(prometheus_text: str) -> list[dict]:
    """Every sample as {"name", "labels", "value"}, in exposition order."""
    return [{"name": s.name, "labels": s.labels, "value": s.value}
            for family in text_string_to_metric_families(prometheus_text) for s in family.samples]


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / MIB:.1f} MiB"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _overview_rows(summary: dict) -> list[tuple[str, str]]:
    block = summary["pool_block_bytes"]
    used, total = summary["pool_blocks_used"], summary["pool_blocks"]
    cache, cascade, plan = summary["prefix_cache"], summary["cascade"], summary["last_plan"]
    ms = lambda key: "-" if summary[key] is None else f"{summary[key]:.2f} ms"  # noqa: E731
    rows = [
        ("BLAS", str(summary["blas"] or "-")),
        ("requests", f"{summary['running']} running · {summary['waiting']} waiting"),
        ("KV pool", f"{used} of {total} blocks used ({_pct(used, total)}) · {_mib(used * block)} of "
                    f"{_mib(total * block)}"),
        ("KV pages", _kv_pages(summary)),
        ("shared / reusable", f"{summary['pool_blocks_shared']} shared · {summary['pool_blocks_reusable']} "
                              "reusable blocks"),
        ("saved by sharing", f"{summary['blocks_saved_by_sharing']} blocks "
                             f"({_mib(summary['blocks_saved_by_sharing'] * block)})"),
        ("prefix cache", f"{cache['hits']} hits of {cache['queries']} lookups ({_pct(cache['hits'], cache['queries'])})"
                         f" · {cache['prefix_tokens_reused']} tokens reused · {cache['evictions']} evictions"),
        ("cascade", f"{'on' if cascade['enabled'] else 'off'} · from {cascade['min_shared_pages']} shared pages, "
                    f"{cascade['min_members']} members"),
        ("last plan", f"{plan['members']} members sharing {plan['shared_pages']} pages ({plan['shared_tokens']} "
                      "tokens)" if plan else f"none ({summary['decline_reason'] or 'no decode step yet'})"),
        ("last launch path", summary["last_path"] or "-"),
        ("decode step", f"p50 {ms('step_latency_p50_ms')} · p99 {ms('step_latency_p99_ms')} · host p50 "
                        f"{ms('step_host_p50_ms')} · device p50 {ms('step_device_p50_ms')}"),
        ("decode throughput", f"{summary['tokens_per_second']:.1f} tokens/s"),
        ("memory", f"{_mib(summary['process_rss_bytes'])} resident · {_mib(summary['mlx_active_memory_bytes'])} "
                   f"MLX active · {_mib(summary['mlx_cache_memory_bytes'])} MLX buffer cache"),
    ]
    return rows


def _kv_pages(summary: dict) -> str:
    if not summary["kv_dtype"]:   # a server from before quantized pages
        return f"{summary['pool_block_bytes'] / 2**10:.1f} KiB each"
    gain = summary["pages_vs_model_dtype"]
    versus = ("the model's dtype" if summary["kv_dtype"] == summary["model_dtype"] else
              f"{gain:.2f}x the pages of {summary['model_dtype']} in the same bytes")
    return f"{summary['kv_dtype']} · {summary['pool_block_bytes'] / 2**10:.1f} KiB each, all layers · {versus}"


def _metric_rows(prometheus_text: str) -> list[tuple[str, str]]:
    """The mlxcel_ families, each sample in its unit; a histogram as its count and mean."""
    rows = []
    for family in text_string_to_metric_families(prometheus_text):
        if not family.name.startswith("mlxcel_") or family.name.endswith("_info"):  # the summary has it
            continue
        if family.type == "histogram":
            totals: dict[str, dict[str, float]] = {}
            for s in family.samples:
                labels = sample_key("", {k: v for k, v in s.labels.items() if k != "le"})
                totals.setdefault(labels, {})[s.name.rsplit("_", 1)[-1]] = s.value
            for labels, t in totals.items():
                count = t.get("count", 0)
                mean = t.get("sum", 0) / count if count else None
                rows.append((family.name + labels, f"{count:g} observed · mean {_unit(family.name, mean)}"))
            continue
        for s in family.samples:
            rows.append((sample_key(s.name, s.labels), _unit(s.name, s.value)))
    return rows


def _unit(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    base = name.removesuffix("_total")
    if base.endswith("_seconds"):
        return f"{value * 1e3:.2f} ms"
    if base.endswith("_bytes") or base.endswith("_bytes_saved"):
        return _mib(value)
    if base.endswith("_usage_ratio"):   # a share, 0-1
        return f"{100 * value:.1f}%"
    if base.endswith("_ratio"):   # one size over another
        return f"{value:.2f}x"
    return f"{value:g}"


def render_table(prometheus_text: str, summary: dict, sessions: list[dict] | None = None) -> str:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=None, width=120, record=True, force_terminal=False)
    overview = Table(title=f"mlxcel · {summary['model']} on {summary['device']} · step {summary['step']}",
                     show_header=False, title_justify="left")
    overview.add_column(style="bold")
    overview.add_column()
    for key, value in _overview_rows(summary):
        overview.add_row(key, value)
    metrics = Table(title="metrics", title_justify="left")
    metrics.add_column("metric")
    metrics.add_column("value", justify="right")
    for key, value in _metric_rows(prometheus_text):
        metrics.add_row(key, value)
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


def as_json(snap: dict, prometheus_text: str, sessions: list[dict] | None = None) -> dict:
    out = {"time": snap["timestamp"], "snapshot": snapshot_summary(snap), "metrics": metric_records(prometheus_text)}
    if sessions is not None:
        out["sessions"] = sessions
    return out


def emit(fmt: str, snap: dict, prometheus_text: str, sessions: list[dict] | None = None,
         one_line: bool = False) -> None:
    """One reading in `fmt`; one_line: JSON on a single line (a --watch piped)."""
    if fmt == "prometheus":
        click.echo(prometheus_text, nl=False)
    elif fmt == "json" or one_line:
        click.echo(json.dumps(as_json(snap, prometheus_text, sessions), indent=None if one_line else 2))
    else:
        click.echo(render_table(prometheus_text, snapshot_summary(snap), sessions), nl=False)


def run_workload(model, sessions, shared_prefix_tokens, max_tokens, turns, cascade, min_shared_pages,
                 min_members, kv_blocks, dtype="auto", ranks=None, kv_dtype="auto"):
    """Run N sessions for a few turns on this thread; returns (engine, sessions, peak snapshot)."""
    from .progress import StderrProgress

    model, notice = served_model(model)
    if notice:
        click.echo(f"mlxcel: {notice}", err=True)
    engine = build_engine(model, cascade, min_shared_pages, min_members, kv_blocks, dtype=dtype,
                          progress=StderrProgress(), ranks=ranks, kv_dtype=kv_dtype)
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


# Cursor home and clear to the end of the screen: a watched table redraws in place.
REDRAW = "\x1b[H\x1b[J"


def _is_terminal() -> bool:
    return sys.stdout.isatty()


def watch_server(source: HttpSource, fmt: str, every: float | None, count: int | None) -> None:
    """Read the server once, or every `every` seconds (`count` times, else until
    interrupted): on a terminal each reading redraws the last; piped, each is one
    line of JSON (JSON Lines), or one Prometheus exposition."""
    terminal = _is_terminal()
    reads = 0
    while True:
        text = source.metrics_text()
        snap = source.snapshot()
        if every is not None and terminal and fmt != "prometheus":
            click.echo(REDRAW, nl=False, color=True)
        emit(fmt, snap, text, one_line=every is not None and not terminal)
        reads += 1
        if every is None or reads == count:
            return
        time.sleep(every)


@click.command()
@click.option("--url", default=None, help="Read a running server (its /metrics and /v1/cascade).")
@click.option("--run", "run_model", is_flag=False, flag_value="", default=None, metavar="[MODEL]",
              help="Run a short session workload headless (default model unless MODEL is given).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "prometheus"]), default="table",
              show_default=True,
              help="table: the summary and metrics in their units; json: {time, snapshot, metrics: [{name, "
                   "labels, value}], sessions}; prometheus: the /metrics text as served.")
@click.option("--watch", type=click.FloatRange(min=0.1), default=None, metavar="SECONDS",
              help="With --url: read again every SECONDS until interrupted; on a terminal the output redraws in "
                   "place, piped it is one JSON object per line.")
@click.option("--count", type=click.IntRange(1), default=None, metavar="N",
              help="With --watch: stop after N readings.")
@click.option("--api-key", envvar="MLXCEL_API_KEY", default=None,
              help="Bearer token for --url [env MLXCEL_API_KEY].")
@click.option("--sessions", type=click.IntRange(1, 1024), default=4, show_default=True,
              help="Client sessions behind one system prompt in --run.")
@click.option("--shared-prefix-tokens", type=click.IntRange(1, 1_000_000), default=None,
              help="Tokens of the synthetic shared system prompt in --run [the built-in prompt].")
@click.option("--max-tokens", type=click.IntRange(1, 8192), default=32, show_default=True,
              help="Tokens each session turn generates in --run.")
@click.option("--turns", type=click.IntRange(1, 1000), default=1, show_default=True,
              help="Questions each session asks in --run.")
@click.option("--kv-blocks", type=click.IntRange(1), default=None, help="KV pool size in blocks for --run.")
@kv_dtype_option
@cascade_options
@model_options
@parallel_options
@debug_option
def stats(url, run_model, fmt, watch, count, api_key, sessions, shared_prefix_tokens, max_tokens, turns, kv_blocks,
          kv_dtype, cascade, min_shared_pages, min_members, dtype, tensor_parallel, backend, debug):
    """Dump engine metrics and a snapshot summary, from --url or a --run."""
    if (url is None) == (run_model is None):
        raise click.UsageError("give exactly one of --url URL or --run [MODEL]")
    if watch is not None and url is None:
        raise click.UsageError("--watch needs --url")
    if count is not None and watch is None:
        raise click.UsageError("--count needs --watch")
    if tensor_parallel is not None and url is not None:
        raise click.UsageError("--tensor-parallel goes with --run")
    if url is not None:
        try:
            watch_server(HttpSource(url, api_key), fmt, watch, count)
        except SourceError as err:
            raise CliError(str(err)) from None
        except KeyboardInterrupt:
            return
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
                                         cascade, min_shared_pages, min_members, kv_blocks, dtype, ranks,
                                         kv_dtype)
    source = EngineSource(engine, manager)
    summary_snap = source.snapshot()
    # The storage figure is read at the busiest step: at the end every page is released.
    summary_snap["sequences"] = peak.to_dict()["sequences"]
    summary_snap["pool"] = {**summary_snap["pool"], "live": peak.pool.live, "shared": peak.pool.shared}
    per_session = [{**s.as_dict(), "completions": s.completions} for s in manager.sessions]
    emit(fmt, summary_snap, generate_latest(engine.metrics.registry).decode(), per_session)
    engine.shutdown()   # under tensor parallelism: the other ranks stop
