"""Command-line options `mlxcel-tui serve` and `mlxcel stats --run` share,
declared once (this module imports nothing of the engine, so the CLI starts fast)."""

from __future__ import annotations

import click

DTYPES = ("auto", "float32", "bfloat16", "float16")


def model_options(f):
    return click.option(
        "--dtype", type=click.Choice(DTYPES), default="auto", show_default=True,
        help="Weight dtype. Built-in models are converted to it (auto: float32 on a CPU, bfloat16 on a GPU); "
             "a model directory's float weights are cast to it (auto: as stored).")(f)
