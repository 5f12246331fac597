"""Operator ablations (``folnet ablate``): `plan` parses and validates a plan of rows (and its
optional [compare] table: pretrained against scratch over a sweep), `run` runs every row once
per seed (resuming what is done), `seeds` one seed of a row -- its pretraining(s) and
finetuning(s) --, `corpus` writes the pretraining corpus without the tasks' held-out questions,
`parallel` runs the seeds in processes of their own (``--jobs N``), `submit` through
submitit as one SLURM job array or local jobs (``--executor``; resources: `cluster`), `rows`
holds a seed's lock and the row's log, `summary` turns a row's seeds into means, spreads and
intervals (`stats`: the bootstrap over seeds and questions) and says which rows differ, `gain` what
pretraining adds (paired by seed and question), `report` writes the table, CSV and JSON,
`figure` the accuracy-by-k figure, the loss curves and the accuracy-by-budget figure, `cli`
registers the command."""
