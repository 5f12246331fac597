"""Operator ablations (``folnet ablate``): `plan` parses and validates a plan of rows, `run`
pretrains and finetunes every row (resuming what is done), `parallel` runs rows in processes of
their own (``--jobs N``), `rows` holds a row's lock and log, `report` writes the table, CSV,
JSON and plot, `cli` registers the command."""
