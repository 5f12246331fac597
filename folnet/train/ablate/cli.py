"""``folnet ablate PLAN``: the command line of `folnet.train.ablate.run`.

Importing this module registers the command and must stay cheap (``folnet --help`` imports
it): the training code is imported inside it.
"""

from __future__ import annotations

import argparse

from folnet.commands import add_operators_flag, register_command, register_operator_file
from folnet.train.ablate.cluster import EXECUTORS


def _bundled_plans() -> str:
    """The bundled plans' names, read from folnet/specs/ablations (so a new one is listed)."""
    from folnet.errors import FolnetError
    from folnet.read_files import specs_dir

    try:
        return ", ".join(sorted(p.stem for p in (specs_dir() / "ablations").glob("*.toml")))
    except (FolnetError, OSError):
        return "none found"


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", help=f"plan file, or the name of a bundled plan ({_bundled_plans()}: "
                   "folnet/specs/ablations)")
    p.add_argument("--out", default=None, help="output directory (default: runs/ablate-NAME)")
    p.add_argument("--preset", default=None, help="model preset for every row (default: the "
                   "plan's)")
    p.add_argument("--steps", type=int, default=None, metavar="N",
                   help="pretraining steps per row (default: the plan's)")
    p.add_argument("--seeds", type=int, default=None, metavar="N",
                   help="seeds per row, each a whole pretrain + finetune run (default: the "
                   "plan's)")
    p.add_argument("--data", default=None, help="pretraining corpus: a path, 'kinship' or "
                   "'kinship-symbolic' "
                   "(default: the plan's)")
    p.add_argument("--tasks", default=None, help="comma-separated downstream tasks (default: "
                   "the plan's)")
    p.add_argument("--task-data", action="append", default=[], metavar="TASK=DIR",
                   help="data directory of a task (repeatable)")
    p.add_argument("--rows", default=None, help="comma-separated rows to run, by name or "
                   "operator string (default all)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                   help="change the plan without copying it: seeds=1, pretrain.steps=20, "
                   "finetune.max_steps=50, compare.scratch_steps=1 (repeatable; checked as the "
                   "plan's own keys, named in its report)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="seeds run in parallel processes, N at a time (the costliest "
                   "rows' seeds first)")
    _cluster_options(p)
    p.add_argument("--no-report", action="store_true", help=argparse.SUPPRESS)
    # set by `--jobs N` on the seed processes it starts: the ablate they must not outlive, and
    # the one seed of the row (--rows) each runs
    p.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--seed-of-row", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--no-progress", action="store_true", help="no progress bars: a plain "
                   "line per logged step, evaluation and finished row instead")
    add_operators_flag(p)  # the plan's rows may use them; recorded with the plan


#: the [cluster] keys the command line sets, by their flags (folnet.train.ablate.cluster)
CLUSTER_FLAGS = {"partition": "--partition", "time": "--time",
                 "gpus_per_task": "--gpus-per-task", "cpus_per_task": "--cpus-per-task",
                 "mem_gb": "--mem-gb", "max_parallel": "--max-parallel"}


def _cluster_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--executor", default="processes", choices=EXECUTORS,
                   help="how the seeds run: processes on this machine (--jobs N), submitit's "
                   "LocalExecutor, or one SLURM job array, a task per row and seed "
                   "(needs folnet[cluster])")
    group = p.add_argument_group("cluster resources per task (--executor slurm; local reads "
                                 "time and max-parallel), also the plan's [cluster] keys")
    group.add_argument("--partition", default=None, help="SLURM partition (default: the "
                       "cluster's)")
    for key, what in (("time", "time limit in minutes (default 60)"),
                      ("gpus_per_task", "GPUs (default 0)"),
                      ("cpus_per_task", "CPUs (default 1)"),
                      ("mem_gb", "memory in GB (default: the cluster's)"),
                      ("max_parallel", "array tasks running at once (default: no limit)")):
        group.add_argument(CLUSTER_FLAGS[key], type=int, default=None, metavar="N", help=what)


def _cluster_overrides(args: argparse.Namespace) -> dict[str, object]:
    """The cluster flags given; refused with --executor processes, which would ignore them."""
    from folnet.errors import FolnetError

    given = {key: getattr(args, key) for key in CLUSTER_FLAGS if getattr(args, key) is not None}
    if given and args.executor == "processes":
        raise FolnetError(f"{', '.join(CLUSTER_FLAGS[k] for k in given)} set(s) cluster "
                          f"resources, which --executor processes does not use; add "
                          f"--executor slurm or --executor local")
    if args.executor != "processes" and args.jobs != 1:
        raise FolnetError(f"--jobs {args.jobs} runs seeds as processes of this machine; with "
                          f"--executor {args.executor} use --max-parallel N")
    return given


def _run(args: argparse.Namespace) -> int:
    if args.parent_pid is not None:  # first, before the heavy imports: end with the parent
        from folnet.train.engine.procs import die_with_parent

        die_with_parent(args.parent_pid)
    from folnet.errors import FolnetError, Interrupted
    from folnet.runtime import tune_cpu_allocator
    from folnet.train.ablate.operators import Declared, file_source, with_record
    from folnet.train.ablate.plan import default_out, parse_plan_dict, read_plan
    from folnet.train.ablate.run import run_plan
    from folnet.train.ablate.submit import Cancelled
    from folnet.train.engine.procs import sigterm_exits

    task_data = {}
    for item in args.task_data:
        if "=" not in item:
            raise FolnetError(f"--task-data expects TASK=DIR, got {item!r}")
        task, path = item.split("=", 1)
        task_data[task] = path
    if args.jobs < 1:
        raise FolnetError(f"--jobs must be >= 1, got {args.jobs}")
    from folnet.ops.spec import spec_to_dict

    data, source = read_plan(args.plan, args.settings)
    out = args.out or str(default_out(data, source))
    # --operators, then what a run into the same OUT recorded: a rerun needs no flag again
    declared = with_record([Declared(spec_to_dict(s), file_source(args.operator_file))
                            for s in register_operator_file(args)], out)
    overrides = {"preset": args.preset, "steps": args.steps, "seeds": args.seeds,
                 "operators": declared, "cluster": _cluster_overrides(args),
                 "data": args.data, "task_data": task_data,
                 "tasks": tuple(args.tasks.split(",")) if args.tasks else None}
    # every row validated before anything trains
    plan = parse_plan_dict(data, source=source, overrides=overrides)
    if args.seed_of_row is not None and not 0 <= args.seed_of_row < plan.seeds:
        raise FolnetError(f"--seed-of-row must be a seed of the plan, 0 .. {plan.seeds - 1}, "
                          f"got {args.seed_of_row}")
    tune_cpu_allocator()
    try:
        with sigterm_exits():  # SIGTERM unwinds: seed locks released, seed processes stopped
            paths = run_plan(plan, out, jobs=args.jobs,
                             only=args.rows.split(",") if args.rows else None,
                             seeds=None if args.seed_of_row is None else [args.seed_of_row],
                             progress=not args.no_progress, report=not args.no_report,
                             executor=args.executor)
    except Cancelled:  # already says what was cancelled and how to go on
        raise
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; the finished rows are kept in {str(out)!r} and a row "
                          f"resumes from its last checkpoint: run the same command again to "
                          f"go on") from None
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    if "md" in paths:
        print()
        print(paths["md"].read_text())
    return 0


register_command("ablate", "run an operator-ablation plan: pretrain, finetune, report",
                 _configure, _run, requires=("tokenizers", "tqdm", "datasets"))
