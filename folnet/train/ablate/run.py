"""`folnet ablate`: run an ablation plan -- pretrain each row, finetune it on the plan's tasks,
and report a table like the paper's Table 3.

Layout of ``OUT``::

    OUT/plan.json                               the validated plan this directory belongs to
    OUT/rows/<row>/seed_<s>/pretrain/           a `folnet pretrain` run directory
    OUT/rows/<row>/seed_<s>/finetune/<task>/    a `folnet finetune` output directory
    OUT/rows/<row>/seed_<s>/result.json         written last: the seed is finished
    OUT/rows/<row>/result.json                  every seed finished: the row's summary
    OUT/results.{md,csv,json,png}

A seed covers the whole row: pretraining (``seed`` of `folnet pretrain`: initialisation, data
order, masks) and finetuning (``seed`` of `folnet finetune`), on the same generated questions
(``data_seed`` is shared), so that the report can bootstrap over seeds and questions
(`folnet.train.ablate.summary`). An interrupted run resumes: finished rows and finished seeds
(their result.json) are skipped, pretraining resumes from its latest checkpoint, a finished
finetune (eval.json) is reused. ``jobs > 1`` runs rows in
parallel processes (`folnet.train.ablate.parallel`), which end with the ablate however it ends.
Whoever runs a row holds its lock (`folnet.train.ablate.rows`): a row that another live process
is running is reported and not started again, and the run ends with an error naming it (the
report covers the rows finished so far).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from folnet.arch import FolnetModel, ModelConfig, model_info, read_metadata
from folnet.atomic_write import atomic_write_json
from folnet.errors import FolnetError
from folnet.train.ablate.parallel import ParallelOutcome, run_parallel
from folnet.train.ablate.plan import LOSSES, AblationPlan, AblationRow, plan_to_dict
from folnet.train.ablate.report import write_reports
from folnet.train.ablate.rows import RowBusy, claim_row, row_dir, running_message
from folnet.train.ablate.summary import summarise_row
from folnet.train.engine.outdir import check_out
from folnet.train.engine.runlog import read_log
from folnet.train.finetune.config import FinetuneConfig, load_finetune_config
from folnet.train.finetune.evaluate import read_predictions
from folnet.train.finetune.run import finetune
from folnet.train.pretrain.config import PretrainConfig, load_pretrain_config
from folnet.train.pretrain.loop import pretrain


def _task_slug(task: str) -> str:
    return task.replace("/", "-")


def seed_dir(out: Path, row: AblationRow, seed: int) -> Path:
    """The directory of one seed of one row."""
    return row_dir(out, row) / f"seed_{seed}"


def _pretrain_config(plan: AblationPlan, row: AblationRow, directory: Path, seed: int,
                     progress: bool) -> PretrainConfig:
    shared = dict(plan.pretrain)
    model = {**dict(shared.pop("model", {})), **row.model_overrides}
    return load_pretrain_config(None, {
        **shared, "ops": row.ops, "data": plan.data, "objective": LOSSES[row.loss],
        "model": model, "out": str(directory / "pretrain"), "resume": "auto",
        "seed": int(shared.get("seed", 0)) + seed, "progress": progress,
        "tensorboard": False})


def _finetune_config(plan: AblationPlan, task: str, directory: Path, seed: int,
                     progress: bool) -> FinetuneConfig:
    shared = dict(plan.finetune)
    return load_finetune_config(None, {
        **shared, "task": task, "data": dict(plan.task_data).get(task),
        "checkpoint": str(directory / "pretrain"), "seeds": 1,
        "seed": int(shared.get("seed", 0)) + seed,
        "out": str(directory / "finetune" / _task_slug(task)), "overwrite": True,
        "progress": progress, "tensorboard": False})


def _pretrain_stats(run_dir: Path) -> dict[str, Any]:
    """Throughput, the last losses and the loss curve from a pretraining log."""
    records = read_log(run_dir / "log.jsonl")
    rates = [r["tokens_per_s"] for r in records[1:] if r.get("tokens_per_s")]
    last = records[-1] if records else {}
    return {"tokens_per_s": statistics.median(rates) if rates else None,
            "mlm_loss": last.get("mlm_loss"), "final_loss": last.get("loss"),
            "pretrain_steps": last.get("step"),
            "loss_curve": [(r["step"], r["loss"]) for r in records]}


def _model_stats(cfg: ModelConfig, seq_len: int) -> dict[str, Any]:
    """Parameters (bare encoder, like the paper's column) and FLOPs per token."""
    with torch.device("meta"):
        model = FolnetModel(cfg)
    info = model_info(model, seq_len)
    return {"params": info.total_params, "flops_per_token": info.flops_forward / seq_len}


def _headline(task: str, payload: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """The task's reported metrics and baselines: the headline split's metrics (for kinship:
    accuracy overall, on the seen chain lengths, on the unseen ones, and per k)."""
    split = payload.get("headline_split")
    metrics = payload.get("metrics", {}).get(split, {})
    main = payload.get("main_metric")
    out: dict[str, float] = {}
    if main in metrics:
        out[main] = metrics[main]
    baselines: dict[str, float] = {}
    for name, value in metrics.items():
        if not isinstance(value, (int, float)) or name == main:
            continue
        if name.startswith("majority_baseline"):
            baselines[name] = value
        else:
            out[name] = value
    return out, baselines


def run_row(plan: AblationPlan, row: AblationRow, out: Path, *, progress: bool = True,
            log: Callable[[str], None] = print) -> dict[str, Any]:
    """Pretrain and finetune one row with each of the plan's seeds (resuming whatever is
    already done), holding the row's lock meanwhile; returns the row's summary. Raises
    `RowBusy` when another live process is running the row."""
    done = row_dir(out, row) / "result.json"
    if done.is_file():
        log(f"[{row.name}] finished earlier: {done}")
        return _read_row(done, plan)
    with claim_row(out, row):
        if done.is_file():  # finished by the process that held the row a moment ago
            log(f"[{row.name}] finished earlier: {done}")
            return _read_row(done, plan)
        seeds = [_run_seed(plan, row, out, seed, progress=progress, log=log)
                 for seed in range(plan.seeds)]
        summary = summarise_row(seeds)
        atomic_write_json(done, summary)
        return summary


def _read_row(path: Path, plan: AblationPlan) -> dict[str, Any]:
    summary = json.loads(path.read_text())
    if len(summary.get("seeds", ())) != plan.seeds:
        raise FolnetError(f"{str(path)!r} was written by an earlier folnet (one pretraining per "
                          f"row, no per-seed results); run the plan into a new --out")
    return summary


def _run_seed(plan: AblationPlan, row: AblationRow, out: Path, seed: int, *, progress: bool,
              log: Callable[[str], None]) -> dict[str, Any]:
    directory = seed_dir(out, row, seed)
    done = directory / "result.json"
    if done.is_file():
        log(f"[{row.name}] seed {seed} finished earlier: {done}")
        return json.loads(done.read_text())
    pcfg = _pretrain_config(plan, row, directory, seed, progress)
    start = time.perf_counter()
    final = directory / "pretrain" / "final"
    if not (final / "config.json").is_file():
        log(f"[{row.name}] seed {seed}: pretraining {row.ops} ({pcfg.preset}, {pcfg.steps} "
            f"steps)")
        pretrain(pcfg)
    pretrain_seconds = time.perf_counter() - start
    cfg = ModelConfig.from_dict(read_metadata(final)["model"])
    result: dict[str, Any] = {
        **{k: v for k, v in asdict(row).items() if k != "paper"}, "paper": dict(row.paper),
        "seed": seed, "D2": cfg.D2, **_model_stats(cfg, pcfg.seq_len),
        **_pretrain_stats(directory / "pretrain"), "pretrain_seconds": pretrain_seconds,
        "metrics": {}, "baselines": {}, "answers": {}, "finetune_curves": {}}
    start = time.perf_counter()
    for task in plan.tasks:
        fcfg = _finetune_config(plan, task, directory, seed, progress)
        eval_json = Path(fcfg.out) / "eval.json"
        if eval_json.is_file():
            payload = json.loads(eval_json.read_text())
        else:
            log(f"[{row.name}] seed {seed}: finetuning on {task}")
            payload = finetune(fcfg)
        metrics, baselines = _headline(task, payload)
        result["metrics"][task] = metrics
        result["baselines"][task] = baselines
        answers = _answers(Path(fcfg.out), payload, fcfg.kinship_train_k)
        if answers is not None:
            result["answers"][task] = answers
        result["finetune_curves"][task] = [
            (r["step"], r["loss"])
            for r in read_log(Path(fcfg.out) / f"seed_{fcfg.seed}" / "log.jsonl")
            if "loss" in r and "step" in r]
    result["finetune_seconds"] = time.perf_counter() - start
    atomic_write_json(done, result)
    log(f"[{row.name}] seed {seed} done in "
        f"{pretrain_seconds + result['finetune_seconds']:.0f} s")
    return result


def _answers(directory: Path, payload: dict[str, Any],
             train_k: Sequence[int]) -> dict[str, Any] | None:
    """Which test questions the seed answered right (and each one's chain length, for the
    kinship tasks), read from the headline split's prediction file: what the report's
    bootstrap over questions resamples. None for tasks without per-question labels."""
    path = directory / "predictions" / f"{payload.get('headline_split')}.tsv"
    if not path.is_file():
        return None
    rows = read_predictions(path)
    if not rows or "label" not in rows[0] or any(r["label"] == "" for r in rows):
        return None
    answers: dict[str, Any] = {"correct": [int(r["prediction"] == r["label"]) for r in rows]}
    if "k" in rows[0]:
        answers["k"] = [int(r["k"]) for r in rows]
        answers["train_k"] = list(train_k)
    return answers


def _check_out(plan: AblationPlan, out: Path) -> None:
    """One plan per output directory: a different plan there is an error, not a mix."""
    record = out / "plan.json"
    mine = json.loads(json.dumps(plan_to_dict(plan)))
    if record.is_file():
        theirs = json.loads(record.read_text())
        if theirs != mine:
            changed = sorted(k for k in mine if mine.get(k) != theirs.get(k))
            raise FolnetError(f"--out {str(out)!r} holds a run of a different plan (differs in "
                              f"{changed}); choose another --out or delete it")
    else:
        atomic_write_json(record, mine)


def run_plan(plan: AblationPlan, out: str | Path, *, jobs: int = 1,
             only: Sequence[str] | None = None, progress: bool = True,
             report: bool = True) -> dict[str, Path]:
    """Run every row of ``plan`` (or the rows named in ``only``) and write the reports.

    Rows that failed (``jobs > 1``) or that another live process is running are named in a
    `FolnetError` raised after the report of the finished rows is written."""
    out = check_out(out, what="ablation")  # before anything is written
    out.mkdir(parents=True, exist_ok=True)
    _check_out(plan, out)
    rows = [r for r in plan.rows if not only or r.name in only or r.slug in only]
    if only and len(rows) != len(set(only)):
        known = [r.name for r in plan.rows]
        raise FolnetError(f"--rows {list(only)} names rows the plan lacks; rows: {known}")
    started = time.perf_counter()
    if jobs <= 1 or len(rows) <= 1:
        outcome = ParallelOutcome()
        for i, row in enumerate(rows, 1):
            print(f"== row {i}/{len(rows)}: {row.name}", flush=True)
            try:
                run_row(plan, row, out, progress=progress)
            except RowBusy as busy:
                outcome.busy[row.name] = busy.holder
                print(f"== {busy}; not started again", flush=True)
    else:
        outcome = run_parallel(rows, out, jobs)
    print(f"== {len(rows)} row(s) in {time.perf_counter() - started:.0f} s", flush=True)
    paths = _write_report(plan, out) if report else {}
    problems = []
    if outcome.failed:
        problems.append(f"row(s) {outcome.failed} failed; see their logs in {str(out)!r}")
    if outcome.busy:
        names = ", ".join(running_message(r, h) for r, h in _named(plan, outcome.busy))
        problems.append(f"{names}; not started again: rerun this command once it has "
                        f"finished to complete the report")
    if problems:
        raise FolnetError("; ".join(problems))
    return paths


def _named(plan: AblationPlan, busy: dict[str, dict[str, object]]
           ) -> list[tuple[AblationRow, dict[str, object]]]:
    return [(row, busy[row.name]) for row in plan.rows if row.name in busy]


def _write_report(plan: AblationPlan, out: Path) -> dict[str, Path]:
    finished = [_read_row(row_dir(out, r) / "result.json", plan)
                for r in plan.rows if (row_dir(out, r) / "result.json").is_file()]
    if not finished:  # every row failed or is running elsewhere: nothing to tabulate yet
        return {}
    header = (f"Plan `{plan.name}` ({plan.source}): {plan.description}\n\n"
              f"Pretraining: {dict(plan.pretrain)} on `{plan.data}`; tasks: "
              f"{', '.join(plan.tasks)}; {plan.seeds} seed(s) per row, each covering "
              f"pretraining and finetuning.")
    return write_reports(finished, out, plan_name=plan.name, header=header)
