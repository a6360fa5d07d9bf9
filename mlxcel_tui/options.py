"""Command-line options `mlxcel-tui serve`, `attach` and `mlxcel stats` share,
declared once, and the one error a command reports."""

from __future__ import annotations

from pathlib import Path

import click

from mlxcel.engine.config import EngineConfig
from mlxcel.engine.limits import ServerLimits
from mlxcel.engine.pool import KV_DTYPES


class CliError(click.ClickException):
    """One clear line for the user; --debug shows the traceback as well."""


def cascade_options(f):
    f = click.option("--min-members", type=click.IntRange(2), default=None,
                     help="Fewest sequences a cascade subgroup needs [env MLXCEL_CASCADE_MIN_MEMBERS, 2].")(f)
    f = click.option("--min-shared-pages", type=click.IntRange(1), default=None,
                     help="Fewest shared pages to cascade [env MLXCEL_CASCADE_MIN_SHARED_PAGES, 16].")(f)
    f = click.option("--cascade/--no-cascade", default=None,
                     help="Cascade attention on or off [env MLXCEL_CASCADE_ATTENTION, off].")(f)
    return f


def session_options(f):
    f = click.option("--max-tokens", type=click.IntRange(1, 8192), default=64, show_default=True,
                     help="Tokens each session turn generates.")(f)
    f = click.option("--shared-prefix-tokens", type=click.IntRange(1, 1_000_000), default=None,
                     help="Use a synthetic system prompt of about this many tokens.")(f)
    f = click.option("--system-prompt", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                     help="File holding the shared system prompt.")(f)
    f = click.option("--sub-prefix-tokens", type=click.IntRange(1, 1_000_000), default=None,
                     help="Give each tenant a shared sub-prefix of about this many tokens after the common "
                          "system prompt (nested sharing).")(f)
    f = click.option("--tenants", type=click.IntRange(1, 64), default=1, show_default=True,
                     help="Split the sessions over this many system prompts (one sharing group each).")(f)
    f = click.option("--sessions", type=click.IntRange(0, 1024), default=4, show_default=True,
                     help="Built-in client sessions sharing the system prompt.")(f)
    return f


def kv_dtype_option(f):
    return click.option(
        "--kv-dtype", type=click.Choice(("auto", *KV_DTYPES)), envvar="MLXCEL_KV_DTYPE", default="auto",
        show_default=True,
        help="KV page format: a float dtype, or int8 (one scale per token and KV head) or int4 (a scale and "
             "zero per 32 channels) codes, quantized once as written (auto: the model's own dtype) "
             "[env MLXCEL_KV_DTYPE].")(f)


def pool_options(f):
    f = kv_dtype_option(f)
    f = click.option("--block-size", type=click.IntRange(1, 1024), default=32, show_default=True,
                     help="Tokens per KV page.")(f)
    f = click.option("--kv-blocks", type=click.IntRange(1), default=None, help="KV pool size in blocks.")(f)
    f = click.option("--kv-cache-mb", type=click.IntRange(1), default=None,
                     help="KV pool size in MiB [1024].")(f)
    f = click.option("--max-batched-tokens", type=click.IntRange(EngineConfig.max_running + 1),
                     default=EngineConfig.max_batched_tokens, show_default=True,
                     help="Tokens one step computes: every running sequence's next one and a chunk of a prompt "
                          "being prefilled (smaller keeps running streams' pace under a long prompt).")(f)
    return f


def limit_options(f):
    f = click.option("--max-body-bytes", type=click.IntRange(1), default=ServerLimits.max_body_bytes,
                     show_default=True, help="Largest request body the server reads (413 beyond).")(f)
    f = click.option("--max-prompt-tokens", type=click.IntRange(1), default=ServerLimits.max_prompt_tokens,
                     show_default=True, help="Longest prompt a request may send, in tokens (400 beyond).")(f)
    return f


def record_option(f):
    return click.option("--record", type=click.Path(dir_okay=False, writable=True, path_type=Path), default=None,
                        metavar="FILE", help="Record every poll the dashboard reads to FILE (JSON lines, gzip "
                                             "when it ends in .gz) for `mlxcel-tui replay FILE`.")(f)


def debug_option(f):
    return click.option("--debug", is_flag=True, help="Show full tracebacks and debug logs.")(f)


def api_key_options(what: str):
    def decorate(f):
        f = click.option("--api-key-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                         default=None, help="Read the API key from FILE.")(f)
        return click.option("--api-key", envvar="MLXCEL_API_KEY", default=None,
                            help=f"{what} [env MLXCEL_API_KEY: unlike a command line, not shown to other "
                                 "users by ps].")(f)
    return decorate

DTYPES = ("auto", "float32", "bfloat16", "float16")


def model_options(f):
    return click.option(
        "--dtype", type=click.Choice(DTYPES), default="auto", show_default=True,
        help="Weight dtype. Built-in models are converted to it (auto: float32 on a CPU, bfloat16 on a GPU); "
             "a model directory's float weights are cast to it (auto: as stored).")(f)


BACKENDS = ("ring", "nccl", "mpi", "jaccl")


def parallel_options(f):
    f = click.option("--backend", type=click.Choice(BACKENDS), default=None,
                     help="mx.distributed backend for --tensor-parallel [nccl where CUDA is the device, else "
                          "ring].")(f)
    f = click.option("--tensor-parallel", type=click.IntRange(1), default=None, metavar="N",
                     help="Split the model over N ranks started with mlx.launch on this machine (under a "
                          "user's own mlx.launch, the ranks it started).")(f)
    return f
