"""`folnet ablate`: run an ablation plan -- pretrain each row, finetune it on the plan's tasks,
and report a table like the paper's Table 3 (and, with a [compare] table, what pretraining adds
over finetuning from scratch).

Layout of ``OUT``::

    OUT/plan.json                 the validated plan this directory belongs to
    OUT/corpus/                   the pretraining corpus of each seed, held-out questions kept
                                  out (`folnet.train.ablate.corpus`)
    OUT/rows/<row>/seed_<s>/      one seed of a row (`folnet.train.ablate.seeds`)
    OUT/rows/<row>/result.json    every seed finished: the row's summary
    OUT/results.{md,csv,json,png}

An interrupted run resumes: finished rows and finished seeds (their result.json) are skipped,
and within a seed whatever finished (`folnet.train.ablate.seeds`). ``jobs > 1`` runs the seeds
of every row in parallel processes, the costliest rows' seeds first
(`folnet.train.ablate.parallel`), which end with the ablate however it ends. Whoever runs a
seed holds its lock (`folnet.train.ablate.rows`): a seed that another live process is running
is reported and not started again, and the run ends with an error naming it (the report covers
the rows finished so far). A row's summary is written by whoever finishes its last seed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from folnet.atomic_write import atomic_write_json
from folnet.errors import FolnetError
from folnet.train.ablate import corpus
from folnet.train.ablate.overrides import select_rows
from folnet.train.ablate.parallel import KILLED_RETRIES, ParallelOutcome, run_parallel
from folnet.train.ablate.plan import AblationPlan, AblationRow, plan_to_dict
from folnet.train.ablate.report import write_reports
from folnet.train.ablate.rows import RowBusy, claim_seed, row_dir, seed_dir
from folnet.train.ablate.seeds import finetune_config, pretrain_seed, row_cost, run_seed
from folnet.train.ablate.submit import run_submitted
from folnet.train.ablate.summary import summarise_cells, summarise_row
from folnet.train.engine.outdir import FreshStart, check_out
from folnet.train.pretrain.config import PretrainConfig
from folnet.train.tasks import kinship as kinship_task


def _prepare_corpora(plan: AblationPlan, out: Path, seeds: Sequence[int]) -> None:
    """Write the held-out corpus of every pretraining seed that lacks one (`corpus`), before
    any row starts: the seed processes of ``--jobs N`` then only read them."""
    if not corpus.holds_out(plan.data, plan.tasks):
        return
    documents = int(dict(plan.pretrain).get("kinship_documents",
                                            PretrainConfig.kinship_documents))
    wanted = {pretrain_seed(plan, s) for s in seeds}
    missing = sorted(s for s in wanted
                     if not corpus.corpus_file(out, plan.data, s).with_suffix(".json").is_file())
    if not missing:
        return
    values = plan.compare.values if plan.compare is not None else (None,)
    options = [finetune_config(plan, task, 0, checkpoint=out, out=out,
                               extra=plan.compare.overrides(v) if plan.compare else None
                               ).to_dict()
               for task in plan.tasks for v in values
               if corpus.holds_out(plan.data, (task,))]
    held = corpus.held_out_questions(options)
    for run in options:  # generated once here: every seed process reads them (run_seed)
        kinship_task.save_questions(out / "corpus", run)
    for s in missing:
        print(f"== writing the pretraining corpus of seed {s} without the "
              f"{sum(map(len, held.values()))} held-out questions", flush=True)
        corpus.write_corpus(out, plan.data, documents=documents, seed=s, held=held,
                            tasks=plan.tasks)


def _corpus(plan: AblationPlan, out: Path, seed: int) -> str:
    """What row seed ``seed`` pretrains on: its held-out corpus file, or the plan's data."""
    if not corpus.holds_out(plan.data, plan.tasks):
        return plan.data
    _prepare_corpora(plan, out, [seed])
    return str(corpus.corpus_file(out, plan.data, pretrain_seed(plan, seed)))


def run_row(plan: AblationPlan, row: AblationRow, out: Path, *,
            seeds: Sequence[int] | None = None, progress: bool = True,
            log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """Pretrain and finetune ``seeds`` of one row (default: every seed of the plan), resuming
    whatever is already done, each under its seed's lock; then, when every seed of the row is
    finished, write and return the row's summary (else None). Raises `RowBusy`, after the
    other seeds ran, when other live processes are running some of them."""
    done = row_dir(out, row) / "result.json"
    if done.is_file():
        log(f"[{row.name}] finished earlier: {done}")
        return _read_row(done, plan)
    busy: dict[int, dict[str, object]] = {}
    for seed in range(plan.seeds) if seeds is None else seeds:
        if (seed_dir(out, row, seed) / "result.json").is_file():
            log(f"[{row.name}] seed {seed} finished earlier: {seed_dir(out, row, seed)}")
            continue  # read with the others by `finish_row`
        try:
            with claim_seed(out, row, seed):
                run_seed(plan, row, out, seed, corpus=_corpus(plan, out, seed),
                         progress=progress, log=log)
        except RowBusy as taken:
            busy.update(taken.holders)
    if busy:
        raise RowBusy(row, busy)
    return finish_row(plan, row, out)


def finish_row(plan: AblationPlan, row: AblationRow, out: Path) -> dict[str, Any] | None:
    """The row's summary, written once every seed of it is finished (None until then). Two
    processes finishing a row's last seeds at once both write the same summary, atomically."""
    done = row_dir(out, row) / "result.json"
    files = [seed_dir(out, row, s) / "result.json" for s in range(plan.seeds)]
    if not all(f.is_file() for f in files):
        return None
    seeds = [json.loads(f.read_text()) for f in files]
    summary = summarise_row(seeds) if plan.compare is None else summarise_cells(seeds)
    atomic_write_json(done, summary)
    return summary


def _read_row(path: Path, plan: AblationPlan) -> dict[str, Any]:
    summary = json.loads(path.read_text())
    if len(summary.get("seeds", ())) != plan.seeds:
        raise FolnetError(f"{str(path)!r} was written by an earlier folnet (one pretraining per "
                          f"row, no per-seed results); run the plan into a new --out")
    return summary


def _check_out(plan: AblationPlan, out: Path) -> None:
    """One plan per output directory: a different plan there is an error, not a mix. Where
    an operator was declared is not the plan (the same spec from another file is the same
    run): the record keeps the first run's words for it, the report names this run's."""
    record = out / "plan.json"
    mine = json.loads(json.dumps(plan_to_dict(plan)))
    if record.is_file():
        theirs = json.loads(record.read_text())
        theirs.pop("operator_sources", None)
        if theirs != {k: v for k, v in mine.items() if k != "operator_sources"}:
            changed = sorted(k for k in mine if mine.get(k) != theirs.get(k))
            raise FolnetError(f"--out {str(out)!r} holds a run of a different plan (differs in "
                              f"{changed}); choose another --out or delete it")
    else:
        atomic_write_json(record, mine)


def run_plan(plan: AblationPlan, out: str | Path, *, jobs: int = 1,
             only: Sequence[str] | None = None, seeds: Sequence[int] | None = None,
             progress: bool = True, report: bool = True,
             executor: str = "processes") -> dict[str, Path]:
    """Run every row of ``plan`` (or the rows named in ``only``; of each, the ``seeds`` given,
    default all) and write the reports. ``executor`` "slurm" or "local" submits the unfinished
    seeds through submitit (`folnet.train.ablate.submit`, resources: ``plan.cluster``) instead
    of running them here.

    Seeds that failed (``jobs > 1``, a submitted one) or that another live process is running
    are named in a `FolnetError` raised after the report of the finished rows is written."""
    out = check_out(out, what="ablation")  # before anything is written
    rows = select_rows(plan.rows, only)
    with FreshStart(out) as fresh:  # a start refused here leaves nothing in OUT
        out.mkdir(parents=True, exist_ok=True)
        _check_out(plan, out)
        _prepare_corpora(plan, out, range(plan.seeds) if seeds is None else seeds)
        fresh.begun()
    started = time.perf_counter()
    outcome = ParallelOutcome()
    if executor != "processes":
        outcome = run_submitted(seed_units(plan, rows, out), out, executor, plan.cluster)
        for row in rows:
            finish_row(plan, row, out)
    elif jobs <= 1:
        for i, row in enumerate(rows, 1):
            print(f"== row {i}/{len(rows)}: {row.name}", flush=True)
            try:
                if run_row(plan, row, out, seeds=seeds, progress=progress) is not None:
                    print(f"== row {i}/{len(rows)} finished: {row.name} "
                          f"({time.perf_counter() - started:.0f} s into the run)", flush=True)
            except RowBusy as busy:
                outcome.busy.append(str(busy))
                print(f"== {busy}; not started again", flush=True)
    else:
        outcome = run_parallel(seed_units(plan, rows, out), out, jobs)
        for row in rows:
            finish_row(plan, row, out)  # (its last seed's process wrote it, unless it died)
    print(f"== {len(rows)} row(s) in {time.perf_counter() - started:.0f} s", flush=True)
    paths = _write_report(plan, out, outcome.retried) if report else {}
    problems = []
    if outcome.failed and executor != "processes":
        problems.append(f"{len(outcome.failed)} unit(s) did not finish: "
                        f"{'; '.join(outcome.failed)}; the same command submits them again")
    elif outcome.failed:
        problems.append(f"{', '.join(outcome.failed)} failed; see the row logs in "
                        f"{str(out)!r}")
    if outcome.busy:
        problems.append(f"{'; '.join(outcome.busy)}; not started again: rerun this command "
                        f"once it has finished to complete the report")
    if problems:
        raise FolnetError("; ".join(problems))
    return paths


def seed_units(plan: AblationPlan, rows: Sequence[AblationRow], out: Path
           ) -> list[tuple[AblationRow, int]]:
    """The unfinished seeds of ``rows``, the costliest rows' first (longest processing time
    first: the cheap seeds fill in at the end, so no process waits long on the last one)."""
    units = []
    for row in rows:
        if (row_dir(out, row) / "result.json").is_file():
            print(f"[{row.name}] finished earlier: {row_dir(out, row) / 'result.json'}",
                  flush=True)
            continue
        for seed in range(plan.seeds):
            done = seed_dir(out, row, seed) / "result.json"
            if done.is_file():
                print(f"[{row.name}] seed {seed} finished earlier: {done}", flush=True)
            else:
                units.append((row, seed))
    cost = {row.name: row_cost(plan, row) for row in {r.name: r for r, _ in units}.values()}
    return sorted(units, key=lambda unit: -cost[unit[0].name])  # stable: seeds in order


def _write_report(plan: AblationPlan, out: Path, retried: Sequence[str] = ()
                  ) -> dict[str, Path]:
    finished = [_read_row(row_dir(out, r) / "result.json", plan)
                for r in plan.rows if (row_dir(out, r) / "result.json").is_file()]
    if not finished:  # every row failed or is running elsewhere: nothing to tabulate yet
        return {}
    settings = (f"\n\nRun with `--set {' --set '.join(plan.settings)}`." if plan.settings
                else "")
    declared = "".join(f"\n\nOperator `{o['symbol']}` ({o['name']}, {o['typing']}) is declared "
                       f"by {source}: kernel `{o['kernel']}`, premise "
                       f"`{o['premise']}`, output `{o['output']}`, batched over "
                       f"`{o['bdim']}`, reduced over `{o['rdim']}`, {o['activation']}."
                       for o, source in zip(plan.operators, plan.operator_sources, strict=True))
    header = (f"Plan `{plan.name}` ({plan.source}): {plan.description}{settings}{declared}\n\n"
              f"Pretraining: {dict(plan.pretrain)} on `{plan.data}`; tasks: "
              f"{', '.join(plan.tasks)}; {plan.seeds} seed(s) per row, each covering "
              f"pretraining and finetuning.")
    if plan.compare is not None:
        header += (f" Each row and seed is also pretrained {plan.compare.scratch_steps} "
                   f"step(s) from the same start (the scratch arm), and both arms are "
                   f"finetuned on the same questions"
                   + (f" at {plan.compare.option} = "
                      f"{', '.join(map(str, plan.compare.values))}."
                      if plan.compare.option is not None else "."))
    if retried:
        header += (f"\n\nRun again from their checkpoints after their process was killed (at "
                   f"most {KILLED_RETRIES} times each): {'; '.join(retried)}.")
    used = [s.get("pretrain_data") or plan.data for r in finished for s in r.get("seeds", ())]
    header += "\n\n" + corpus.describe_corpora(plan.data, plan.tasks, used)
    return write_reports(finished, out, plan_name=plan.name, header=header,
                         compare=plan.compare)
