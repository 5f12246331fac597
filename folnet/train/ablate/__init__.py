"""Operator ablations (``folnet ablate``): `plan` parses and validates a plan of rows, `run`
pretrains and finetunes every row (resuming what is done), `report` writes the table, CSV, JSON
and plot, `cli` registers the command."""
