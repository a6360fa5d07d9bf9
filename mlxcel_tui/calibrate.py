"""`mlxcel calibrate`: measure the cascade cost model's constants on this
device (seconds) and store them in $MLXCEL_HOME for the decode planner."""

from __future__ import annotations

import json

import click

from mlxcel.engine import cost_model


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the constants as JSON.")
def calibrate(as_json):
    """Measure launch cost, KV bandwidth and merge cost of the attention kernels here."""
    model = cost_model.calibrate()
    path = cost_model.save(model)
    if as_json:
        click.echo(json.dumps({"file": str(path), **vars(model)}))
    else:
        click.echo(f"{model.describe()}\nwritten to {path}")
