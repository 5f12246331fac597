"""One seed of one ablation row: its pretraining(s) and finetuning(s), and the seed's result.

Layout of ``OUT/rows/<row>/seed_<s>/``::

    pretrain/                        a `folnet pretrain` run directory (the plan's steps)
    finetune/<task>/                 a `folnet finetune` output directory (plans without
                                     [compare])
    scratch/                         the scratch arm's pretraining ([compare] plans)
    cells/<cell>/finetune/<task>/    one arm finetuned at one value of the sweep ([compare])
    cells/<cell>/result.json         written when the cell is finished
    result.json                      written last: the seed is finished

A seed covers the whole row: pretraining (``seed`` of `folnet pretrain`: initialisation, data
order, masks) and finetuning (``seed`` of `folnet finetune`), on the same generated questions
(``data_seed`` is shared), so that the report can bootstrap over seeds and questions. With a
[compare] table (`folnet.train.ablate.plan.Compare`) the seed pretrains both arms with that
seed -- same corpus, tokenizer and initial weights -- and finetunes each at every value of the
sweep with that seed: the cells differ in the pretraining steps and the swept option alone.

Everything resumes: a finished seed or cell (its result.json) is reused, a pretraining resumes
from its latest checkpoint (its final model: skipped), a finished finetune (eval.json) is read.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from folnet.arch import FolnetModel, ModelConfig, model_info, read_metadata
from folnet.arch.config import make_config
from folnet.atomic_write import atomic_write_json
from folnet.train.ablate.plan import ARMS, LOSSES, AblationPlan, AblationRow
from folnet.train.ablate.rows import seed_dir
from folnet.train.engine.optim import warmup_steps_for
from folnet.train.engine.runlog import read_log
from folnet.train.finetune.config import FinetuneConfig, load_finetune_config
from folnet.train.finetune.evaluate import read_predictions
from folnet.train.finetune.run import finetune
from folnet.train.pretrain.config import PretrainConfig, load_pretrain_config
from folnet.train.pretrain.loop import pretrain
from folnet.train.tasks.kinship import load_questions

__all__ = ["finetune_config", "pretrain_seed", "row_cost", "run_seed"]

Log = Callable[[str], None]


def pretrain_seed(plan: AblationPlan, seed: int) -> int:
    """The pretraining seed of the row seed ``seed`` (the [pretrain] table's seed, plus it)."""
    return int(dict(plan.pretrain).get("seed", 0)) + seed


def _task_slug(task: str) -> str:
    return task.replace("/", "-")


def _pretrain_config(plan: AblationPlan, row: AblationRow, run_dir: Path, seed: int, *,
                     data: str, steps: int | None, progress: bool) -> PretrainConfig:
    shared = dict(plan.pretrain)
    if steps is not None:
        shared["steps"] = steps
    model = {**dict(shared.pop("model", {})), **row.model_overrides}
    return load_pretrain_config(None, {
        **shared, "ops": row.ops, "data": data, "objective": LOSSES[row.loss], "kind": row.kind,
        "model": model, "operators": list(plan.operators), "out": str(run_dir),
        "resume": "auto",
        "seed": pretrain_seed(plan, seed), "progress": progress, "tensorboard": False})


def finetune_config(plan: AblationPlan, task: str, seed: int, *, checkpoint: Path, out: Path,
                    extra: Mapping[str, Any] | None = None,
                    progress: bool = False) -> FinetuneConfig:
    """The finetuning run of ``task`` for row seed ``seed``: the plan's [finetune] options and
    ``extra`` (a sweep value), from ``checkpoint`` into ``out/<task>``."""
    shared = {**dict(plan.finetune), **dict(extra or {})}
    return load_finetune_config(None, {
        **shared, "task": task, "data": dict(plan.task_data).get(task),
        "checkpoint": str(checkpoint), "seeds": 1,
        "seed": int(shared.get("seed", 0)) + seed,
        "out": str(out / _task_slug(task)), "overwrite": True,
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
    """Parameters (bare encoder, like the paper's column) and FLOPs per token. A decoder's or
    an encoder-decoder's are those of the encoder of its shape: one stack, where an
    encoder-decoder has two."""
    with torch.device("meta"):
        model = FolnetModel(cfg.replace(kind="encoder"))
    info = model_info(model, seq_len)
    return {"params": info.total_params, "flops_per_token": info.flops_forward / seq_len}


def row_cost(plan: AblationPlan, row: AblationRow) -> float:
    """The forward FLOPs per token of the row's model at the plan's length (`_model_stats`):
    what orders the seeds of ``--jobs N``, the costliest rows first."""
    pcfg = _pretrain_config(plan, row, Path("."), 0, data=plan.data, steps=None,
                            progress=False)
    cfg = make_config(pcfg.ops, preset_name=pcfg.preset,
                      overrides={"vocab_size": pcfg.vocab_size, **pcfg.model_overrides})
    return float(_model_stats(cfg, pcfg.seq_len)["flops_per_token"])


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


def _pretrain(pcfg: PretrainConfig, what: str, log: Log) -> dict[str, Any]:
    """Run (or resume, or skip when finished) one pretraining; its stats and timing."""
    start = time.perf_counter()
    if not (Path(pcfg.out) / "final" / "config.json").is_file():
        log(f"{what}: pretraining {pcfg.ops} ({pcfg.preset}, {pcfg.steps} steps)")
        pretrain(pcfg)
    warmup = warmup_steps_for(pcfg.steps, pcfg.warmup_ratio)
    # the schedule's factor is 0 at the first step when there is warmup: no update then
    return {**_pretrain_stats(Path(pcfg.out)), "pretrain_seconds": time.perf_counter() - start,
            "pretrain_updates": pcfg.steps - (1 if warmup > 0 else 0)}


def _finetune(plan: AblationPlan, seed: int, checkpoint: Path, out: Path, what: str,
              log: Log, *, extra: Mapping[str, Any] | None = None,
              progress: bool, questions: Path | None = None) -> dict[str, Any]:
    """Finetune ``checkpoint`` on every task of the plan (a finished task is read back):
    metrics, baselines, per-question answers and loss curves by task. ``questions``: the
    folder where the ablation's parent left its generated kinship questions before any row
    ran (`folnet.train.ablate.run`), read instead of generated again."""
    result: dict[str, Any] = {"metrics": {}, "baselines": {}, "answers": {},
                              "finetune_curves": {}}
    start = time.perf_counter()
    for task in plan.tasks:
        fcfg = finetune_config(plan, task, seed, checkpoint=checkpoint, out=out, extra=extra,
                               progress=progress)
        eval_json = Path(fcfg.out) / "eval.json"
        if eval_json.is_file():
            payload = json.loads(eval_json.read_text())
        else:
            log(f"{what}: finetuning on {task}")
            if questions is not None:
                load_questions(questions, fcfg.to_dict())
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
    return result


def _recorded_data(run_dir: Path) -> str | None:
    """The corpus a pretraining already started on (its run_config.json), which its resume
    must keep: a run directory written before held-out corpora pretrained on the plan's."""
    path = run_dir / "run_config.json"
    return json.loads(path.read_text()).get("data") if path.is_file() else None


def run_seed(plan: AblationPlan, row: AblationRow, out: Path, seed: int, *, corpus: str,
             progress: bool, log: Log) -> dict[str, Any]:
    """Run (or resume) one seed of one row, pretraining on ``corpus``; its result."""
    directory = seed_dir(out, row, seed)
    done = directory / "result.json"
    if done.is_file():
        log(f"[{row.name}] seed {seed} finished earlier: {done}")
        return json.loads(done.read_text())
    what = f"[{row.name}] seed {seed}"
    start = time.perf_counter()

    def config(run_dir: Path, steps: int | None) -> PretrainConfig:
        data = _recorded_data(run_dir) or corpus
        return _pretrain_config(plan, row, run_dir, seed, data=data, steps=steps,
                                progress=progress)

    pcfg = config(directory / "pretrain", None)
    stats = _pretrain(pcfg, what, log)
    cfg = ModelConfig.from_dict(read_metadata(directory / "pretrain" / "final")["model"])
    result: dict[str, Any] = {
        **{k: v for k, v in asdict(row).items() if k != "paper"}, "paper": dict(row.paper),
        "seed": seed, "D2": cfg.D2, **_model_stats(cfg, pcfg.seq_len),
        "pretrain_data": pcfg.data}
    if plan.compare is None:
        result.update(stats)
        result.update(_finetune(plan, seed, directory / "pretrain", directory / "finetune",
                                what, log, progress=progress, questions=out / "corpus"))
    else:
        compare = plan.compare
        result["cells"] = []
        for arm in ARMS:
            run_dir = directory / ("pretrain" if arm == "pretrained" else "scratch")
            if arm != "pretrained":
                steps = compare.scratch_steps
                stats = _pretrain(config(run_dir, steps), f"{what} {arm}", log)
            for value in compare.values:
                name = compare.cell_name(arm, value)
                cell_done = directory / "cells" / name / "result.json"
                if cell_done.is_file():
                    result["cells"].append(json.loads(cell_done.read_text()))
                    continue
                cell = {"arm": arm, "value": value, **stats, **_finetune(
                    plan, seed, run_dir, directory / "cells" / name / "finetune",
                    f"{what} {name}", log, extra=compare.overrides(value), progress=progress,
                    questions=out / "corpus")}
                atomic_write_json(cell_done, cell)
                result["cells"].append(json.loads(cell_done.read_text()))
    atomic_write_json(done, result)
    log(f"{what} done in {time.perf_counter() - start:.0f} s")
    return json.loads(done.read_text())
