"""Ablation plans: a TOML file of rows (operator string, position encoding, D2, pretraining
loss), like the paper's Table 3, parsed and validated before anything trains.

A plan::

    name = "demo"
    data = "kinship"                 # pretraining corpus: a path, "kinship", "kinship-symbolic"
    tasks = ["kinship"]              # downstream tasks (folnet finetune names)
    seeds = 3                        # runs per row (pretraining + finetuning), seeds 0, 1, 2

    [pretrain]                       # folnet pretrain options shared by every row
    preset = "tiny"
    steps = 300

    [finetune]                       # folnet finetune options shared by every row
    epochs = 3

    [[rows]]
    ops = "jmc.atp"                  # required
    name = "jmc.atp D2=16"           # optional; unique
    position = "rpe"                 # rpe, ape, rpe* or none
    D2 = 16
    loss = "MLM.NSP"                 # or MLM.SOP; CLM, PREFIX (a decoder), SPAN (enc-dec)

    [compare]                        # optional: what pretraining adds (see `Compare`)
    scratch_steps = 1                # pretraining steps of the "scratch" arm
    sweep = { kinship_train_size = [400, 1000] }   # one [finetune] option, its values

Every fault -- an unknown key, an invalid operator string, a missing data path, an unknown
task -- is a `FolnetError` naming the row and the problem, raised by `load_plan` before any
training starts.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from folnet.arch import POSITIONS, load_preset, parse_plan
from folnet.errors import FolnetError, choices
from folnet.read_files import bundled_or_path, parse_json
from folnet.train.ablate.cluster import ClusterResources, parse_cluster
from folnet.train.ablate.operators import Declared, plan_operators
from folnet.train.ablate.overrides import apply_settings, parse_setting
from folnet.train.ablate.plan_tasks import check_kinds, check_tasks
from folnet.train.data.documents import EMBEDDED, KINSHIP
from folnet.train.finetune.config import FinetuneConfig
from folnet.train.options import read_toml
from folnet.train.pretrain.config import PretrainConfig

#: A row's pretraining loss -> `folnet pretrain`'s objective; the losses of the generative kinds
#: name the kind they pretrain (`LOSS_KINDS`): next-token prediction for a decoder (CLM, or
#: PREFIX for the PrefixLM), span corruption for an encoder-decoder.
LOSSES = {"MLM.NSP": "nsp", "MLM.SOP": "sop", "CLM": "clm", "PREFIX": "prefix", "SPAN": "span"}
LOSS_KINDS = {"MLM.NSP": "encoder", "MLM.SOP": "encoder", "CLM": "decoder",
              "PREFIX": "decoder", "SPAN": "encoder-decoder"}
PLAN_KEYS = ("name", "description", "data", "tasks", "task_data", "seeds", "operators",
             "operator_sources", "pretrain", "finetune", "rows", "compare", "set", "cluster")
ROW_KEYS = ("name", "ops", "position", "D2", "loss", "paper")
COMPARE_KEYS = ("scratch_steps", "sweep")
#: [finetune] options the plan sets for every run, so neither [finetune] nor a sweep may
PLAN_SET_FINETUNE = ("task", "data", "checkpoint", "out", "seeds")
#: ...and those a sweep may not vary either: every cell of a row answers the same questions
#: with the same run seed, so that the arms and the sweep's values compare question by question
UNSWEPT = (*PLAN_SET_FINETUNE, "seed", "data_seed")
#: The two arms of a comparison: the plan's pretraining, and `Compare.scratch_steps` of it.
ARMS = ("pretrained", "scratch")


@dataclass(frozen=True)
class AblationRow:
    """One row: an architecture and a pretraining loss."""

    name: str
    ops: str
    position: str = "rpe"
    D2: int | None = None
    loss: str = "MLM.NSP"
    paper: tuple[tuple[str, Any], ...] = ()  # reference figures to print beside ours

    @property
    def slug(self) -> str:
        """A directory name for the row's runs."""
        name = self.name.replace("*", "star")
        return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", name).strip("_") or "row"

    @property
    def kind(self) -> str:
        """The kind of model the row pretrains: its loss says (`LOSS_KINDS`)."""
        return LOSS_KINDS[self.loss]

    @property
    def model_overrides(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"position": self.position}
        if self.D2 is not None:
            extra["D2"] = self.D2
        return extra


@dataclass(frozen=True)
class Compare:
    """Pretrained against scratch: every row and seed is pretrained twice -- the plan's steps
    (the ``pretrained`` arm) and ``scratch_steps`` (the ``scratch`` arm: same seed, corpus,
    tokenizer and initialisation; one step that warmup runs at learning rate 0 leaves the
    initial weights) -- and each arm is finetuned once per value of the swept [finetune]
    ``option`` (the label budget, ``kinship_train_size``), on the same questions. Without a
    sweep (``option`` None) each arm is finetuned once, with [finetune] as it is."""

    scratch_steps: int = 1
    option: str | None = None
    values: tuple[Any, ...] = (None,)

    def cells(self) -> list[tuple[str, Any]]:
        """(arm, value) of every finetuning a seed of a row runs, arm by arm."""
        return [(arm, value) for arm in ARMS for value in self.values]

    def overrides(self, value: Any) -> dict[str, Any]:
        """The [finetune] options one value of the sweep sets."""
        return {} if self.option is None else {self.option: value}

    def cell_name(self, arm: str, value: Any) -> str:
        """A directory name for one cell: ``pretrained``, ``scratch-kinship_train_size=400``."""
        return arm if self.option is None else f"{arm}-{self.option}={value}"


@dataclass(frozen=True)
class AblationPlan:
    name: str
    rows: tuple[AblationRow, ...]
    data: str = "kinship"
    tasks: tuple[str, ...] = ("kinship",)
    task_data: tuple[tuple[str, str], ...] = ()  # task -> data directory
    seeds: int = 1
    description: str = ""
    pretrain: tuple[tuple[str, Any], ...] = field(default_factory=tuple)
    finetune: tuple[tuple[str, Any], ...] = field(default_factory=tuple)
    source: str = "<plan>"
    compare: Compare | None = None  # pretrained against scratch, over a sweep
    # the operators its rows' strings may use -- its own [[operators]] tables, --operators
    # FILE, those recorded in OUT/plan.json -- and where each was declared (the report's words)
    operators: tuple[dict[str, Any], ...] = ()
    operator_sources: tuple[str, ...] = field(default=(), compare=False)
    settings: tuple[str, ...] = ()  # the command line's --set KEY=VALUE, as given
    # what each unit asks of a cluster (`folnet.train.ablate.cluster`): not the plan's identity
    cluster: ClusterResources = field(default=ClusterResources(), compare=False)


def _row(raw: Any, index: int, plan_name: str, preset: str, num_layers: int) -> AblationRow:
    where = f"plan {plan_name!r} row {index + 1}"
    if not isinstance(raw, Mapping):
        raise FolnetError(f"{where}: expected a table, got {raw!r}")
    if "name" in raw:
        where += f" ({raw['name']!r})"
    unknown = sorted(set(raw) - set(ROW_KEYS))
    if unknown:
        raise FolnetError(f"{where}: unknown key(s) {unknown}; allowed: {list(ROW_KEYS)}")
    if "ops" not in raw:
        raise FolnetError(f"{where}: missing 'ops' (an operator string such as 'jmc.atp')")
    ops = raw["ops"]
    try:
        parse_plan(ops, num_layers)
    except FolnetError as exc:
        raise FolnetError(f"{where}: {exc}") from None
    position = raw.get("position", "rpe")
    if position not in POSITIONS:
        raise FolnetError(f"{where}: position {position!r} is unknown; use {choices(POSITIONS)}")
    d2 = raw.get("D2")
    if d2 is not None and (not isinstance(d2, int) or isinstance(d2, bool) or d2 < 1):
        raise FolnetError(f"{where}: D2 must be a positive integer, got {d2!r}")
    loss = raw.get("loss", "MLM.NSP")
    if loss not in LOSSES:
        raise FolnetError(f"{where}: loss {loss!r} is unknown; use {choices(LOSSES)}")
    paper = raw.get("paper", {})
    if not isinstance(paper, Mapping):
        raise FolnetError(f"{where}: 'paper' must be a table of reference figures")
    name = raw.get("name") or f"{ops} {position.upper()}" + (f" D2={d2}" if d2 else "") + (
        "" if loss == "MLM.NSP" else f" {loss.removeprefix('MLM.')}")
    return AblationRow(name=str(name), ops=ops, position=position, D2=d2, loss=loss,
                       paper=tuple(paper.items()))


def parse_plan_dict(data: Mapping[str, Any], *, source: str = "<plan>",
                    overrides: Mapping[str, Any] | None = None) -> AblationPlan:
    """Validate a plan mapping; ``overrides`` (from the command line) replace top-level keys
    (``data``, ``seeds``) and pretraining options (``preset``, ``steps``)."""
    unknown = sorted(set(data) - set(PLAN_KEYS))
    if unknown:
        raise FolnetError(f"{source}: unknown key(s) {unknown}; allowed: {list(PLAN_KEYS)}")
    name = str(data.get("name", Path(source).stem))
    overrides = dict(overrides or {})
    pretrain = dict(data.get("pretrain", {}))
    for key in ("preset", "steps"):
        if overrides.get(key) is not None:
            pretrain[key] = overrides[key]
    for key in ("ops", "out", "data", "objective", "kind", "resume"):
        if key in pretrain:
            raise FolnetError(f"{source}: [pretrain] must not set {key!r}; the plan sets it "
                              f"per row")
    try:
        PretrainConfig.from_dict({**pretrain, "out": "x"}, source=f"{source} [pretrain]")
    except FolnetError as exc:
        raise FolnetError(f"plan {name!r}: {exc}") from None
    preset_name = pretrain.get("preset", "base")
    num_layers = int(dict(pretrain.get("model", {})).get("L", load_preset(preset_name)["L"]))
    finetune = data.get("finetune", {})
    if not isinstance(finetune, Mapping):
        raise FolnetError(f"{source}: [finetune] must be a table")
    for key in PLAN_SET_FINETUNE:
        if key in finetune:
            raise FolnetError(f"{source}: [finetune] must not set {key!r}; the plan sets it "
                              f"(the plan's 'seeds' runs whole rows, pretraining included)")
    if "operators" in pretrain:
        raise FolnetError(f"{source}: declare the plan's operators in [[operators]] tables, "
                          f"not in [pretrain]")
    extra = [d if isinstance(d, Declared) else Declared(d, "--operators")
             for d in overrides.get("operators") or ()]
    operators, sources = plan_operators(data.get("operators", []),
                                        data.get("operator_sources", {}), extra, name)
    rows_raw = data.get("rows")
    if not rows_raw:
        raise FolnetError(f"{source}: the plan has no [[rows]]")
    rows = tuple(_row(r, i, name, preset_name, num_layers) for i, r in enumerate(rows_raw))
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        if row.slug in seen:
            raise FolnetError(f"plan {name!r} row {i + 1} ({row.name!r}): same name as row "
                              f"{seen[row.slug] + 1}; give each row a unique 'name'")
        seen[row.slug] = i
    plan_data = overrides.get("data") or data.get("data", KINSHIP)
    if plan_data not in EMBEDDED and not Path(plan_data).exists():
        raise FolnetError(f"plan {name!r}: data path {plan_data!r} does not exist (every row "
                          f"pretrains on it)")
    tasks = tuple(overrides.get("tasks") or data.get("tasks", ("kinship",)))
    task_data = {**dict(data.get("task_data", {})), **dict(overrides.get("task_data") or {})}
    check_tasks(name, tasks, task_data)
    check_kinds(name, rows, tasks)
    seeds = int(overrides.get("seeds") or data.get("seeds", 1))
    if seeds < 1:
        raise FolnetError(f"plan {name!r}: seeds must be >= 1, got {seeds}")
    compare = None
    if "compare" in data:
        steps = pretrain.get("steps", PretrainConfig.steps)
        compare = _compare(data["compare"], name, steps, finetune)
    return AblationPlan(name=name, rows=rows, data=plan_data, tasks=tasks,
                        task_data=tuple(sorted(task_data.items())), seeds=seeds,
                        description=str(data.get("description", "")),
                        pretrain=tuple(pretrain.items()), finetune=tuple(finetune.items()),
                        source=source, compare=compare, operators=operators,
                        operator_sources=sources,
                        settings=tuple(str(x) for x in data.get("set", ())),
                        cluster=parse_cluster(data.get("cluster"), overrides.get("cluster"),
                                              where=f"plan {name!r}"))


def _compare(raw: Any, name: str, steps: int, finetune: Mapping[str, Any]) -> Compare:
    """The [compare] table, checked: scratch steps below the plan's, one swept [finetune]
    option whose every value makes a valid finetuning run."""
    where = f"plan {name!r} [compare]"
    if not isinstance(raw, Mapping):
        raise FolnetError(f"{where} must be a table, got {raw!r}")
    unknown = sorted(set(raw) - set(COMPARE_KEYS))
    if unknown:
        raise FolnetError(f"{where}: unknown key(s) {unknown}; allowed: {list(COMPARE_KEYS)}")
    scratch = raw.get("scratch_steps", Compare.scratch_steps)
    if isinstance(scratch, bool) or not isinstance(scratch, int) or scratch < 1:
        raise FolnetError(f"{where}: scratch_steps must be an integer >= 1, got {scratch!r} "
                          f"(pretraining also builds the tokenizer and the checkpoint the "
                          f"finetuning starts from; its first step runs at learning rate 0 "
                          f"under warmup, so 1 step leaves the initial weights)")
    if scratch >= steps:
        raise FolnetError(f"{where}: scratch_steps = {scratch} must be fewer than the "
                          f"pretraining steps ({steps}), or the two arms are the same run")
    sweep = raw.get("sweep")
    if sweep is None:
        return Compare(scratch_steps=scratch)
    if not isinstance(sweep, Mapping) or len(sweep) != 1:
        raise FolnetError(f"{where}: sweep must be a table of one [finetune] option and its "
                          f"values, e.g. sweep = {{ kinship_train_size = [400, 1000] }}; got "
                          f"{sweep!r}")
    ((option, values),) = sweep.items()
    known = sorted(f.name for f in dataclasses.fields(FinetuneConfig))
    if option not in known:
        raise FolnetError(f"{where}: sweep option {option!r} is no [finetune] option (e.g. "
                          f"kinship_train_size, max_steps, lr); known: {known}")
    if option in UNSWEPT:
        raise FolnetError(f"{where}: sweep option {option!r} cannot be swept (the plan sets "
                          f"{list(UNSWEPT)} alike for every cell)")
    if option in finetune:
        raise FolnetError(f"{where}: sweep option {option!r} is set in [finetune] too "
                          f"({finetune[option]!r}); leave it to the sweep")
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise FolnetError(f"{where}: sweep {option} must be a non-empty list of values, got "
                          f"{values!r}")
    if len({repr(v) for v in values}) != len(values):
        raise FolnetError(f"{where}: sweep {option} repeats a value: {list(values)!r}")
    for value in values:
        try:
            FinetuneConfig.from_dict({**finetune, option: value},
                                     source=f"plan {name!r} [finetune]")
        except FolnetError as exc:
            raise FolnetError(f"{where}: sweep {option} = {value!r}: {exc}") from None
    return Compare(scratch_steps=scratch, option=str(option), values=tuple(values))


def plan_to_dict(plan: AblationPlan) -> dict[str, Any]:
    """The plan as data (what ``OUT/plan.json`` holds); `parse_plan_dict` reads it back."""
    rows = []
    for r in plan.rows:
        row = {"name": r.name, "ops": r.ops, "position": r.position, "loss": r.loss,
               "paper": dict(r.paper)}
        if r.D2 is not None:
            row["D2"] = r.D2
        rows.append(row)
    out = {"name": plan.name, "description": plan.description, "data": plan.data,
           "tasks": list(plan.tasks), "task_data": dict(plan.task_data), "seeds": plan.seeds,
           "pretrain": dict(plan.pretrain), "finetune": dict(plan.finetune), "rows": rows}
    if plan.operators:  # absent otherwise, as in plans written before it
        out["operators"] = [dict(spec) for spec in plan.operators]
        out["operator_sources"] = {spec["symbol"]: source for spec, source
                                   in zip(plan.operators, plan.operator_sources, strict=True)}
    if plan.settings:
        out["set"] = list(plan.settings)
    if plan.compare is not None:  # absent otherwise: plans written before it read the same
        compare: dict[str, Any] = {"scratch_steps": plan.compare.scratch_steps}
        if plan.compare.option is not None:
            compare["sweep"] = {plan.compare.option: list(plan.compare.values)}
        out["compare"] = compare
    return out


def load_plan(path: str | Path, overrides: Mapping[str, Any] | None = None,
              settings: Sequence[str] = ()) -> AblationPlan:
    """Read and validate an ablation plan: a TOML file (``folnet/specs/ablations/NAME.toml``, or
    just NAME) or the ``plan.json`` an ablation run writes into its output directory, with the
    command line's ``--set KEY=VALUE`` ``settings`` applied first
    (`folnet.train.ablate.overrides`) and checked as the plan's own keys are."""
    data, source = read_plan(path, settings)
    return parse_plan_dict(data, source=source, overrides=overrides)


def default_out(data: Mapping[str, Any], source: str) -> Path:
    """Where a plan's run goes without ``--out``: ``runs/ablate-NAME``."""
    return Path(f"runs/ablate-{data.get('name', Path(source).stem)}")


def read_plan(path: str | Path, settings: Sequence[str] = ()) -> tuple[dict[str, Any], str]:
    """A plan's data, ``settings`` applied, not yet validated, and its source (`load_plan`)."""
    path = bundled_or_path(path, "ablations", what="ablation plan")
    if path.suffix == ".json":
        try:
            data = parse_json(path.read_text(), str(path))
        except json.JSONDecodeError as exc:
            raise FolnetError(f"{path}: not valid JSON ({exc})") from None
    else:
        data = read_toml(path)
    if settings:
        # the [cluster] settings are resources, not the plan: not recorded with it
        kept = [s for s in settings if parse_setting(s)[0][0] != "cluster"]
        data = {**apply_settings(data, settings, PLAN_KEYS), "set": kept}
    return data, str(path)
