"""Operator ablations (``folnet ablate``): `plan` parses and validates a plan of rows, `run`
pretrains and finetunes every row once per seed (resuming what is done), `parallel` runs rows
in processes of their own (``--jobs N``), `rows` holds a row's lock and log, `summary` turns a
row's seeds into means, spreads and intervals (`stats`: the bootstrap over seeds and questions)
and says which rows differ, `report` writes the table, CSV and JSON, `figure` the accuracy-by-k
figure and loss curves, `cli` registers the command."""
