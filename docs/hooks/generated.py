"""The documentation's generated parts, rendered while the site builds (a mkdocs hook).

A page asks for one by a marker on a line of its own, ``<!-- folnet:NAME -->`` or
``<!-- folnet:NAME ARG -->`` (indented inside a list item for the one-line parts), which
`on_page_markdown` replaces with markdown made from the code and the data: the command line
from ``folnet.cli.build_parser()``, the option tables from the option dataclasses and their
defaults files, the plan keys from ``folnet/train/ablate/plan.py``, the operator spec fields
from ``OperatorSpec``, the built-in operators from the registry, console transcripts of quick
commands run as the page is built, and the measured figures from the files the benchmarks and
the demos wrote under ``docs/figures/``. Nothing here is a copy that could drift: an unknown
marker, a missing figure file, a field without a description or a description of a field
that no longer exists stops the build. tests/project/test_docs_reference.py and
test_docs_figures.py import this module too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "docs" / "figures"
MARKER = re.compile(r"^[ \t]*<!-- folnet:([a-z0-9-]+)(?: (.+?))? -->[ \t]*$", re.MULTILINE)

if str(ROOT) not in sys.path:  # the checkout's folnet, also where it is not installed
    sys.path.insert(0, str(ROOT))


try:  # mkdocs prints a PluginError as one line; the tests import this module without it too
    from mkdocs.exceptions import PluginError as _Stop
except ImportError:  # pragma: no cover
    _Stop = Exception


class DocsError(_Stop):
    """A generated part cannot be made: the build stops, naming the page and the marker."""


def _cell(text: object) -> str:
    """A markdown table cell: pipes escaped, line breaks folded."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _code(text: object) -> str:
    text = str(text)
    return f"`{text}`" if text else ""


# -- the command line ---------------------------------------------------------------------------

_DEFAULT_IN_HELP = re.compile(r"\s*\(default:? ([^()]*(?:\([^()]*\)[^()]*)*)\)\s*$")


def _help_and_default(action: argparse.Action, prog: str) -> tuple[str, str]:
    """An option's help text (argparse's %-formatting applied) and its default, shown apart."""
    text = action.help or ""
    if text is argparse.SUPPRESS:
        return "", ""
    try:
        text = text % {**vars(action), "prog": prog}
    except (KeyError, TypeError, ValueError):
        pass
    default = action.default
    shown = ""
    match = _DEFAULT_IN_HELP.search(text)
    if match:
        shown, text = match.group(1), text[:match.start()]
    elif default not in (None, False, [], argparse.SUPPRESS) and action.option_strings:
        shown = str(default)
    return text.strip(), shown


def _spelling(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar or action.dest
    if isinstance(action, argparse.BooleanOptionalAction):
        return " / ".join(action.option_strings)
    takes = action.nargs != 0
    choices = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else ""
    metavar = action.metavar or (choices or action.dest.upper() if takes else "")
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    return ", ".join(f"{o} {metavar}".strip() for o in action.option_strings)


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every ``folnet`` command and its parser, every option declared."""
    from folnet.cli import build_parser

    return build_parser()[1]


def cli_reference() -> str:
    """Every command of ``folnet``, its usage and its options with their defaults."""
    from folnet.cli import build_parser

    top, subs = build_parser()
    out = ["`folnet --version` prints the version; `folnet COMMAND --help` prints what follows "
           "for one command.", ""]
    out.append(_table(["command", "what it does"],
                      [(f"[`folnet {name}`](#folnet-{name})", p.description or "")
                       for name, p in subs.items()]))
    for name, parser in subs.items():
        out += ["", f"## folnet {name}", "", parser.description or "", "",
                "```text", parser.format_usage().strip(), "```", ""]
        positional, optional = [], []
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help is argparse.SUPPRESS:
                continue  # -h, and the options folnet passes to its own child processes
            text, default = _help_and_default(action, parser.prog)
            row = (_code(_spelling(action)), _code(default), text)
            (optional if action.option_strings else positional).append(row)
        if positional:
            out += [_table(["argument", "", "meaning"], positional), ""]
        out.append(_table(["option", "default", "meaning"], optional))
    assert top.prog == "folnet"
    return "\n".join(out)


def console(command: str) -> str:
    """``folnet COMMAND`` run now, in an empty temporary folder, and what it printed: the
    messages and tables a page shows are the program's own. Only for commands that answer at
    once (usage errors, ``info``, ``ops``): it runs in the build's process."""
    import contextlib
    import io
    import os
    import shlex
    import tempfile

    from folnet.cli import main

    argv = shlex.split(command)
    printed = io.StringIO()
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as work:
        os.chdir(work)
        try:
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                try:
                    status = main(argv)
                except SystemExit as exc:  # argparse's own errors
                    status = exc.code
        finally:
            os.chdir(here)
    text = printed.getvalue().rstrip()
    if not text:
        raise DocsError(f"folnet {command} printed nothing")
    shown = f"$ folnet {command}\n{text}"
    if status:
        shown += f"\n$ echo $?\n{status}"
    return f"```console\n{shown}\n```"


# -- configuration ------------------------------------------------------------------------------

#: What each field of `folnet.arch.ModelConfig` means (the glossary explains the letters).
MODEL_FIELDS = {
    "ops": "the operator string ([Operator strings](../concepts/operator-strings.md))",
    "kind": "encoder, decoder or encoder-decoder",
    "D1": "width of the unary stream (one vector per token)",
    "D2": "width of the binary stream (one vector per token pair)",
    "L": "number of layers",
    "H": "number of heads",
    "S": "channels per head",
    "F1": "hidden width of the unary FFN",
    "F2": "hidden width of the binary FFN",
    "delta": "relative distances are clipped at delta - 1 (the rpe table has 2 delta + 2 rows)",
    "position": "position encoding: rpe, ape, ape+rpe, rpe* or none",
    "vocab_size": "tokens in the vocabulary (the embedding's rows: see vocab_multiple)",
    "type_vocab_size": "token types (segments)",
    "max_positions": "longest sequence the absolute table and the checks allow",
    "dropout": "dropout on the streams and the heads",
    "attention_dropout": "dropout on the activated kernels (None: the same as dropout)",
    "layer_norm_eps": "epsilon of every LayerNorm",
    "initializer_range": "standard deviation of the initial weights",
    "backend": "how the operators run: auto, a backend name or a priority list",
    "operators": "the spec tables of the non-built-in operators the string uses",
    "vocab_multiple": "the word embedding's rows are vocab_size rounded up to a multiple of "
                      "this (8 as built; what a resize asked, 1 by default)",
}


def _check_described(what: str, names: Iterable[str], described: Mapping[str, str]) -> None:
    names = list(names)
    missing = [n for n in names if n not in described]
    stale = [n for n in described if n not in names]
    if missing or stale:
        raise DocsError(f"{what}: no description for {missing}; described but gone: {stale} "
                        f"(docs/hooks/generated.py)")


def model_config_reference() -> str:
    from folnet.arch import PRESETS, ModelConfig, load_preset

    fields = dataclasses.fields(ModelConfig)
    _check_described("ModelConfig", [f.name for f in fields], MODEL_FIELDS)
    presets = {name: load_preset(name) for name in PRESETS}
    rows = []
    for f in fields:
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        rows.append([_code(f.name), _code(str(f.type).replace("'", "")), _code(repr(default)),
                     *[_code(presets[p][f.name]) if f.name in presets[p] else ""
                       for p in PRESETS], MODEL_FIELDS[f.name]])
    return _table(["field", "type", "default", *PRESETS, "meaning"], rows)


def presets_table() -> str:
    """The size presets (folnet/specs/models/), one column each."""
    from folnet.arch import PRESETS, load_preset

    presets = {name: load_preset(name) for name in PRESETS}
    names = [k for k in MODEL_FIELDS if any(k in p for p in presets.values())]
    return _table(["", *PRESETS], [[_code(k), *[presets[p].get(k, "") for p in PRESETS]]
                                   for k in names])


def _options(cls: type, defaults_file: Path) -> str:
    from folnet.train.options import format_default, read_toml

    defaults = read_toml(defaults_file)
    rows = []
    for f in dataclasses.fields(cls):
        value = defaults.get(f.name, f.default)
        shown = "(none)" if value is None else format_default(value)
        if isinstance(value, Mapping):
            shown = ", ".join(f"{k}={v}" for k, v in value.items()) or "(none)"
        rows.append([_code(f.name), _code(cls.flag(f.name)), _code(shown),
                     f.metadata.get("help", "").replace("%%", "%")])
    where = defaults_file.relative_to(ROOT).as_posix()
    set_there = sorted(k for k in defaults if not isinstance(defaults[k], Mapping))
    note = ("The defaults are the dataclass's, written there once" + (
        f"; `{where}` changes {', '.join(f'`{k}`' for k in set_there)}." if set_there
        else f" (`{where}` sets none)."))
    return note + "\n\n" + _table(["key (TOML)", "flag", "default", "meaning"], rows)


def pretrain_options() -> str:
    from folnet.train.pretrain.config import PretrainConfig, default_config_path

    return _options(PretrainConfig, default_config_path())


def finetune_options() -> str:
    from folnet.train.finetune.config import FinetuneConfig, default_config_path

    return _options(FinetuneConfig, default_config_path())


def _first_comment(path: Path) -> str:
    """What a bundled config is, from the first line of its leading comment (to a '(' or
    ':' -- the rest of the comment is for readers of the file)."""
    first = path.read_text(encoding="utf-8").splitlines()[0]
    return re.split(r" \(|:", first.lstrip("# ").strip())[0].rstrip(".")


def bundled_files() -> str:
    """The bundled run configs (``--config NAME``) and ablation plans (``folnet ablate NAME``)."""
    from folnet.read_files import specs_dir
    from folnet.train.options import read_toml

    specs = Path(str(specs_dir()))
    rows = [(_code(f"--config {p.stem}"), _first_comment(p))
            for p in sorted((specs / "train").glob("*.toml"))]
    rows += [(_code(f"folnet ablate {p.stem}"), read_toml(p).get("description") or
              _first_comment(p)) for p in sorted((specs / "ablations").glob("*.toml"))]
    return _table(["name", "what it is"], rows)


#: The ablation plan's keys (folnet/train/ablate/plan.py), by table.
PLAN_KEYS = {
    "name": "the plan's name, used in the report",
    "description": "one line for the report",
    "data": "pretraining corpus: a path, 'kinship' or 'kinship-symbolic'",
    "tasks": "finetuning tasks (folnet finetune --task names)",
    "task_data": "a table: task -> its data directory",
    "seeds": "runs per row (pretraining and finetuning), seeds 0, 1, ...",
    "operators": "[[operators]] tables: the plan's own operators, usable in its rows",
    "operator_sources": "where each operator was declared (the plan, an --operators file); "
                        "written into plan.json, read back by a rerun into the same OUT",
    "pretrain": "[pretrain] table: folnet pretrain options every row shares",
    "finetune": "[finetune] table: folnet finetune options every row shares",
    "rows": "[[rows]] tables: the rows (keys below)",
    "compare": "[compare] table: pretrained against scratch (keys below)",
    "set": "the --set KEY=VALUE settings a run applied (written into plan.json)",
    "cluster": "[cluster] table: what each unit asks of --executor slurm or local (keys below; "
               "not part of the plan's identity, not written into plan.json)",
}
ROW_KEYS = {
    "name": "the row's name (unique; default: ops and position)",
    "ops": "operator string (required)",
    "position": "rpe, ape, ape+rpe, rpe* or none",
    "D2": "width of the binary stream for this row",
    "loss": "MLM.NSP or MLM.SOP (an encoder); CLM or PREFIX (a decoder: next token, PrefixLM), "
            "SPAN (an encoder-decoder)",
    "paper": "reference figures printed beside the row's",
}
COMPARE_KEYS = {
    "scratch_steps": "pretraining steps of the scratch arm (1: the initial weights)",
    "sweep": "one [finetune] option and its values, e.g. { kinship_train_size = [400, 1000] }",
}

#: What each [cluster] key means (folnet/train/ablate/cluster.py).
CLUSTER_KEYS = {
    "partition": "SLURM partition (--partition; default: the cluster's)",
    "time": "minutes per unit, 1 to 525600 (--time; default 60)",
    "gpus_per_task": "GPUs per unit, 0 to 64 (--gpus-per-task; default 0)",
    "cpus_per_task": "CPUs per unit, 1 to 1024 (--cpus-per-task; default 1)",
    "mem_gb": "memory per unit in GB, 1 to 65536 (--mem-gb; default: the cluster's)",
    "max_parallel": "array tasks at once, 1 to 100000 (--max-parallel; default: no limit)",
}


def plan_reference() -> str:
    from folnet.train.ablate import cluster, plan

    parts = []
    for title, names, described in (("Top level", plan.PLAN_KEYS, PLAN_KEYS),
                                    ("`[[rows]]`", plan.ROW_KEYS, ROW_KEYS),
                                    ("`[compare]`", plan.COMPARE_KEYS, COMPARE_KEYS),
                                    ("`[cluster]`", cluster.CLUSTER_KEYS, CLUSTER_KEYS)):
        _check_described(f"plan keys ({title})", names, described)
        parts += [f"**{title}**", "", _table(["key", "meaning"],
                                             [(_code(n), described[n]) for n in names]), ""]
    parts.append("A `[finetune]` table and a sweep may not set "
                 + ", ".join(_code(n) for n in plan.PLAN_SET_FINETUNE)
                 + " (the plan sets them for every run); a sweep may not vary "
                 + ", ".join(_code(n) for n in plan.UNSWEPT if n not in plan.PLAN_SET_FINETUNE)
                 + " either.")
    return "\n".join(parts)


#: What each field of an operator spec means (folnet/ops/spec.py).
SPEC_FIELDS = {
    "symbol": "one lower-case letter, used in operator strings",
    "name": "a name for messages and tables",
    "typing": "OUT <- KERNEL x PREMISE, each U (unary) or B (binary)",
    "kernel": "index letters of the kernel, batch implicit and first",
    "premise": "index letters of the premise",
    "output": "index letters of the output",
    "bdim": "the batching letter (in all three lists)",
    "rdim": "the reduction letter (summed out)",
    "activation": "identity, or softmax over the R-dim",
    "mask": "which of kernel and premise a causal model masks (paper Table 5)",
    "sizes": "a table: channel letter -> size expression of D1, D2, H, S, F1, F2",
    "kernel_proj": "a table: bias (true/false) and a constant scale expression",
    "premise_proj": "the same for the premise",
    "realisation": "einsum, or ffn (the b operator, run as the FFN stage)",
    "kernel_dropout": "attention dropout on the activated kernel",
    "remark": "free text: where the operator departs from the paper",
}


def spec_reference() -> str:
    from folnet.ops import spec

    fields = dataclasses.fields(spec.OperatorSpec)
    _check_described("OperatorSpec", [f.name for f in fields], SPEC_FIELDS)
    rows = []
    for f in fields:
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            default = "required"
        else:
            value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            default = _code(_spec_default(value, SPEC_FIELDS[f.name].startswith("a table")))
        rows.append((_code(f.name), default, SPEC_FIELDS[f.name]))
    letters = (f"Index letters: tokens {', '.join(map(_code, spec.TOKEN_LETTERS))}; channels "
               f"{', '.join(map(_code, spec.CHANNEL_LETTERS))}. Activations: "
               f"{', '.join(map(_code, spec.ACTIVATIONS))}. Channel sizes by default: "
               + ", ".join(f"{_code(k)} = {_code(v)}" for k, v in spec.DEFAULT_SIZES.items())
               + ".")
    return _table(["field", "default", "meaning"], rows) + "\n\n" + letters


def _spec_default(value: Any, table: bool = False) -> str:
    if table and value in ((), {}):
        return "{}"
    if dataclasses.is_dataclass(value):
        return "{ " + ", ".join(f"{f.name} = {json.dumps(getattr(value, f.name))}"
                                for f in dataclasses.fields(value)) + " }"
    if isinstance(value, tuple):
        return json.dumps(list(value))
    return json.dumps(value)


def operators_table() -> str:
    from folnet.ops.table import registry_table

    return registry_table(fmt="markdown")


def _spec_value(value: Any) -> str:
    """A validated spec field, compactly: index lists as letters, tables as k = v."""
    if dataclasses.is_dataclass(value) and type(value).__str__ is not object.__str__:
        return str(value)  # a typing: "U <- B x U"
    if dataclasses.is_dataclass(value):
        return ", ".join(f"{f.name} {getattr(value, f.name)}" for f in dataclasses.fields(value))
    if isinstance(value, tuple) and value and all(isinstance(v, tuple) for v in value):
        return ", ".join(f"{k} = {v}" for k, v in value)
    if isinstance(value, tuple):
        return " ".join(map(str, value)) or "-"
    return str(value)


def operator_specs() -> str:
    """Every field of every built-in operator as the registry holds it (validated), one row
    per field, one column per operator."""
    import folnet
    from folnet.ops import spec
    from folnet.ops.registry import is_builtin

    builtins = [op for op in folnet.operators() if is_builtin(op.symbol)]
    fields = [f.name for f in dataclasses.fields(spec.OperatorSpec)
              if f.name not in ("symbol", "remark")]
    rows = [[_code(name), *[_cell(_spec_value(getattr(op, name))) for op in builtins]]
            for name in fields]
    remarks = "\n".join(f"- `{op.symbol}` ({op.name}): {op.remark}" for op in builtins
                         if op.remark)
    return (_table(["field", *[f"`{op.symbol}`" for op in builtins]], rows)
            + "\n\nRemarks, as the specs give them:\n\n" + remarks)



# -- measured figures ---------------------------------------------------------------------------


def _read(path: Path) -> Any:
    if not path.is_file():
        raise DocsError(f"{path.relative_to(ROOT)} is missing: the figure comes from it")
    return json.loads(path.read_text()) if path.suffix == ".json" else path.read_text()


def machine_line(machine: Mapping[str, Any]) -> str:
    """'2026-11-27 16:41, Intel(R) Xeon(R) Processor, 2 cores, torch 2.13.0+cpu' from the
    ``machine`` record the benchmarks write (benchmarks/harness.py)."""
    when = str(machine.get("time", "?"))[:16]
    cpu = machine.get("cpu_model") or machine.get("cpu") or "?"
    parts = [when, machine.get("cuda") or cpu]
    if machine.get("cores"):
        parts.append(f"{machine['cores']} cores")
    if machine.get("threads"):
        parts.append(f"{machine['threads']} threads")
    parts.append(f"torch {machine.get('torch', '?')}")
    return ", ".join(str(p) for p in parts)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def figure_hf_compile() -> str:
    data = _read(FIGURES / "hf_compile.json")
    args = data["args"]
    rows = [(r["model"], r["graphs"], r["breaks"], f"{r['first_compiled_s']:.1f} s",
             f"{r['eager_s'] * 1000:.0f} ms", f"{r['compiled_s'] * 1000:.0f} ms",
             _ratio(r["eager_s"], r["compiled_s"])) for r in data["rows"]]
    return (f"*Measured {machine_line(data['machine'])}; `benchmarks/hf_compile.py`, batch "
            f"{args['batch']}, T {args['seq_len']}, vocabulary {args['vocab']}, backend "
            f"{args['backend']}, median of {args['repeats']} steps.*\n\n"
            + _table(["model", "graphs", "breaks", "first compiled step", "eager step",
                      "compiled step", "eager / compiled"], rows))


def figure_conformance() -> str:
    """`make conformance`'s counts per test class (docs/figures/conformance.json)."""
    data = _read(FIGURES / "conformance.json")
    rows = [(cls, c["passed"], c["failed"], c["skipped"], c["total"])
            for cls, c in data["counts"].items()]
    return (f"*Measured {machine_line(data['machine'])}; transformers {data['transformers']}, "
            f"{data['seconds']} s with {data['jobs']} test processes; `make conformance`.*\n\n"
            + _table(["test class", "passed", "failed", "skipped", "of"], rows))


def figure_conformance_refused() -> str:
    """The tests folnet is listed as not passing (tests/conformance/refused.toml)."""
    from folnet.read_files import load

    refused = load(ROOT / "tests" / "conformance" / "refused.toml")
    rows = [(f"`{name}`", entry["status"], ", ".join(entry.get("classes", ["all three"])),
             " ".join(entry["reason"].split())) for name, entry in refused.items()]
    return _table(["test", "status", "classes", "why"], rows)


def figure_train_step() -> str:
    """benchmarks/train_step.py's table: one MLM + NSP training step per operator string and
    precision, each case in its own process."""
    data = _read(FIGURES / "train_step.json")
    args = data["args"]
    rows = [(_code(r["ops"]), r["dtype"], f"{r['step_s']:.3f} s", f"{r['tokens_per_s']:,.0f}",
             f"{r['gflop']:.1f}", f"{r['peak_frac']:.0%}", f"{r['peak_mb']:,.0f} MiB")
            for r in data["rows"] if r.get("impl", "ours") == "ours"]
    return (f"*Measured {machine_line(data['machine'])}; `benchmarks/train_step.py`, preset "
            f"{args['preset']}, batch {args['batch']}, T {args['seq_len']}, vocabulary "
            f"{args['vocab_size']}, AdamW, median of {args['repeats']} steps after "
            f"{args['warmup']}; a float32 matrix product ran at "
            f"{data['matmul_peak_gflops']:.0f} GFLOP/s in the same run.*\n\n"
            + _table(["ops", "precision", "step", "tokens/s", "GFLOP/step",
                      "of the float32 product peak", "peak memory"], rows))


def figure_step_tensors(variant: str | None = None) -> str:
    """benchmarks/step_tensors.py's table: what a long training step holds at its peak, by
    category, the op that made it and its shape (the largest groups, then the rest); the small
    preset's in the default memory mode (step_tensors.json) or a variant's, another preset or
    mode (step_tensors_<variant>.json)."""
    data = _read(FIGURES / (f"step_tensors_{variant}.json" if variant else "step_tensors.json"))
    args, unit, shown = data["args"], data["unit_bytes"], 12
    rows = [(r["category"], _code(r["op"]), "x".join(map(str, r["shape"])) or "?",
             r["tensors"], f"{r['bytes'] / 2**20:.1f}", f"{r['bytes'] / unit:.2f}")
            for r in data["rows"][:shown]]
    rest = data["rows"][shown:]
    if rest:
        total = sum(r["bytes"] for r in rest)
        rows.append((f"(the rest: {len(rest)} groups)", "", "", "", f"{total / 2**20:.1f}",
                     f"{total / unit:.2f}"))
    return (f"*Measured {machine_line(data['machine'])}; `benchmarks/step_tensors.py`, "
            f"{_code(args['ops'])} {args['preset']}, T {args['seq_len']}, batch "
            f"{args['batch']}, activation checkpointing {args['checkpointing']}, memory mode "
            f"{args['mode']}: the step's peak {data['peak_bytes'] / 2**20:.0f} MiB above the "
            f"steady state = {data['peak_bytes'] / unit:.1f} U (U = B x T² x D2 x 4 bytes = "
            f"{unit / 2**20:.0f} MiB).*\n\n"
            + _table(["category", "made by", "shape", "tensors", "MiB", "U"], rows))


def step_estimate() -> str:
    """What one optimiser step at `folnet pretrain`'s default batch costs on the machine of
    the training-step figure, scaled from its measured micro-batch (a sentence for pages)."""
    from folnet.train.pretrain.config import load_pretrain_config

    data = _read(FIGURES / "train_step.json")
    batch = load_pretrain_config().batch_size  # what a run without options uses
    row = next(r for r in data["rows"] if r["ops"] == "jmc.atp" and r["dtype"] == "float32")
    per_step = row["step_s"] * batch / data["args"]["batch"]
    return (f"the default global batch is {batch} sequences per step; on the machine of the "
            f"training-step figure ({machine_line(data['machine'])}) a small-preset jmc.atp "
            f"float32 step at batch "
            f"{data['args']['batch']} and T {data['args']['seq_len']} took "
            f"{row['step_s']:.2f} s, so a step of {batch} sequences takes about "
            f"{per_step:.0f} s there (scaled from the measured batch)")


def figure_generate() -> str:
    """benchmarks/generate.py's table: time per new token, cached against recomputed."""
    data = _read(FIGURES / "generate.json")
    rows = [(r["preset"], _code(r["ops"]), r["new_tokens"], f"{r['cached_ms']:.2f}",
             f"{r['recomputed_ms']:.1f}", f"{r['speedup']:.1f}x", r["method"])
            for r in data["rows"]]
    return (f"*Measured {machine_line(data['machine'])}; `benchmarks/generate.py`, a decoder, "
            f"{data['dtype']}, batch {data['batch']}, a {data['rows'][0]['prompt']}-token "
            f"prompt, greedy.*\n\n"
            + _table(["preset", "ops", "new tokens", "cached ms/token", "recomputed ms/token",
                      "cached speed-up", "recomputed timing"], rows))


def figure_step_census() -> str:
    """benchmarks/step_census.py before the speed work and now: launching ops and host syncs
    per training step, folnet's beside BERT's, on the CPU's and CUDA's kernel choices."""
    before = _read(FIGURES / "step_census" / "before.json")
    after = _read(FIGURES / "step_census" / "after.json")
    old = {(r["preset"], r["path"]): r for r in before["rows"]}
    rows = []
    for r in after["rows"]:
        b = old.get((r["preset"], r["path"]))
        if b is None:
            raise DocsError(f"step_census/before.json has no {r['preset']} {r['path']} row")
        f0, f1, bert = b["folnet"], r["folnet"], r["bert"]
        rows.append((r["preset"], r["path"], f"{f0['launches']:,}", f"{f1['launches']:,}",
                     f"{bert['launches']:,}", _ratio(f0["launches"], bert["launches"]),
                     _ratio(f1["launches"], bert["launches"]),
                     f"{f0['syncs']} -> {f1['syncs']}" if r["path"] == "cuda" else "-",
                     f"{b['lamb_alone']:,} -> {r['lamb_alone']:,}",
                     f"{f0['bytes'] / 1e6:,.0f} -> {f1['bytes'] / 1e6:,.0f}",
                     f"{bert['bytes'] / 1e6:,.0f}"))
    args = after["rows"][0]
    return (f"*Before: {machine_line(before['machine'])} ({before.get('label', '')}); now: "
            f"{machine_line(after['machine'])} ({after.get('label', '')}). "
            f"`benchmarks/step_census.py`, jmc.atp, batch {args['batch']}, T "
            f"{args['seq_len']}, {args['optimizer']} (fused on CUDA); counts do not depend on "
            f"T, B or the machine (bytes do). Syncs are counted on the CUDA path only (on a CPU "
            f"the host is the device). The MB moved count each operation's operands and results "
            f"once, the optimiser's included.*\n\n"
            + _table(["preset", "path", "folnet before", "folnet now", "BERT", "before / BERT",
                      "now / BERT", "host syncs", "LAMB alone", "folnet MB moved",
                      "BERT MB moved"], rows))


def figure_step_bytes() -> str:
    """benchmarks/step_census.py's bytes per step and their floor, before the pair stream's
    work (bytes_before.json) and now (bytes.json), folnet beside BERT."""
    data = _read(FIGURES / "step_census" / "bytes.json")
    before = _read(FIGURES / "step_census" / "bytes_before.json")
    old = {(r["preset"], r["path"]): r["folnet"] for r in before["rows"]}
    rows = []
    for r in data["rows"]:
        f, bert, was = r["folnet"], r["bert"], old[r["preset"], r["path"]]
        rows.append((r["preset"], r["path"], f"{was['bytes'] / 1e6:,.0f}",
                     f"{f['bytes'] / 1e6:,.0f}", f"{f['floor'] / 1e6:,.0f}",
                     f"{was['bytes'] / was['floor']:.2f}x -> {f['bytes'] / f['floor']:.2f}x",
                     f"{was['launches']:,} -> {f['launches']:,}",
                     f"{bert['bytes'] / 1e6:,.0f}", f"{bert['bytes'] / bert['floor']:.2f}x",
                     _ratio(f["bytes"], bert["bytes"])))
    args = data["rows"][0]
    return _measured(data, f"before: {before.get('label', '')}. `benchmarks/step_census.py`, "
                           f"jmc.atp, batch {args['batch']}, T {args['seq_len']}. The floor: "
                           f"each storage's bytes read once and written once per phase of the "
                           f"step, copies, layouts and fills not counted as values (the "
                           f"module's docstring says how).",
                     ["preset", "path", "folnet MB before", "folnet MB now", "its floor now",
                      "folnet / floor", "launches", "BERT MB", "BERT / floor",
                      "folnet / BERT"], rows)


def _measured(data: dict, caption: str, header: list[str], rows: list) -> str:
    """A figure's table under its caption, which names the machine (and the run's label)."""
    label = f" ({data['label']})" if data.get("label") else ""
    return f"*Measured {machine_line(data['machine'])}{label}; {caption}*\n\n" + _table(header,
                                                                                       rows)


def figure_layer_trace() -> str:
    """benchmarks/layer_trace.py before the layer's rewrite (60b9e4c) and now."""
    before = _read(FIGURES / "layer_trace" / "before.json")
    after = _read(FIGURES / "layer_trace" / "after.json")
    old = {r["path"]: r for r in before["rows"]}
    rows = [(r["path"], f"{old[r['path']]['files']} -> {r['files']}",
             f"{old[r['path']]['crossings']} -> {r['crossings']}",
             f"{old[r['path']]['calls']} -> {r['calls']}") for r in after["rows"]]
    args = after["args"]
    return (f"*`benchmarks/layer_trace.py`: one {args['preset']} {args['ops']} encoder layer's "
            f"training forward at T {args['seq_len']}, batch 2, traced with sys.setprofile "
            f"(counts depend on the code only).*\n\n"
            + _table(["path", "folnet files", "crossings between files", "Python calls"], rows))


def figure_kinship_generation() -> str:
    """benchmarks/kinship_generation.py: the kinship questions answered by generation, per k."""
    data = _read(FIGURES / "kinship_generation.json")
    args = data["args"]
    rows = [(r["kind"], r["k"], r["questions"], f"{r['exact_match']:.1f}", f"{r['f1']:.1f}",
             f"{r['guess']:.1f}") for r in data["rows"]]
    took = {r["kind"]: r for r in data["rows"]}
    times = "; ".join(f"{kind}: pretraining {r['pretrain_s']:.0f} s, finetuning "
                      f"{r['finetune_s']:.0f} s, generating {r['generate_s']:.0f} s"
                      for kind, r in took.items())
    return _measured(data, f"`benchmarks/kinship_generation.py`, tiny jmc.atp "
                           f"models pretrained {args['steps']} steps on {args['documents']} "
                           f"kinship documents, finetuned {args['epochs']} epochs on "
                           f"{args['train']} questions of k 2 and 3, {args['test']} test "
                           f"questions; {times}.",
                     ["kind", "k", "questions", "exact match %", "F1 %",
                      "the commonest training answer %"], rows)


def figure_decoder_text() -> str:
    """benchmarks/decoder_text.py: what examples/decoder_text.py wrote at its recipe."""
    data = _read(FIGURES / "decoder_text.json")
    args = data["args"]
    lines = "\n".join(f"{prompt}|{said}" for prompt, said in data["written"])
    return (f"*`python examples/decoder_text.py` ({args['steps']} steps on "
            f"{args['documents']} documents, {args['new_tokens']} new tokens), run by "
            f"`benchmarks/decoder_text.py` {machine_line(data['machine'])}: "
            f"{data['seconds'] / 60:.1f} minutes.*\n\n```text\n{lines}\n```")


def figure_compile_step() -> str:
    """benchmarks/compile_step.py: the pretraining step eager and compiled, one process."""
    data = _read(FIGURES / "compile_step.json")
    rows = [(r["preset"], r["seq_len"], r["batch"], r["optimizer"], f"{r['compile_s']:.0f} s",
             f"{r['eager_s'] * 1000:.0f} ms", f"{r['compiled_s'] * 1000:.0f} ms",
             f"{r['speedup']:.2f}x") for r in data["rows"]]
    first = data["rows"][0]
    return _measured(data, f"`benchmarks/compile_step.py`, {first['rounds']} rounds of "
                           f"{first['steps']} steps, eager and compiled alternating, medians; "
                           f"the compile is the first compiled step (inductor, fullgraph).",
                     ["preset", "T", "batch", "optimizer", "compile", "eager step",
                      "compiled step", "compiled speed"], rows)


def figure_generate_static() -> str:
    """benchmarks/generate.py --static: the static cache, eager and compiled."""
    data = _read(FIGURES / "generate_static.json")
    rows = [(r["preset"], r["new_tokens"], f"{r['recomputed_ms']:.1f}", f"{r['cached_ms']:.2f}",
             f"{r['static_ms']:.2f}", f"{r['static_compiled_ms']:.2f}",
             f"{r['compiled_speedup']:.1f}x", f"{r['compile_s']:.0f} s")
            for r in data["rows"]]
    return (f"*Measured {machine_line(data['machine'])}; `benchmarks/generate.py --static`, a "
            f"decoder, {data['dtype']}, batch {data['batch']}, a "
            f"{data['rows'][0]['prompt']}-token prompt, greedy; the compiled step with "
            f"inductor's default mode (on CUDA `compile=True` takes CUDA graphs).*\n\n"
            + _table(["preset", "new tokens", "recomputed ms/token", "dynamic cache",
                      "static cache", "static, compiled", "compiled over recomputed",
                      "compile"], rows))


def figure_tolerances() -> str:
    """`make tolerances`' report (tests/tolerance_report.py --json): every numerical bound of
    the tests with the share of it each kernel set used."""
    data = _read(FIGURES / "tolerances.json")

    def share(x: float | None) -> str:
        return "-" if x is None else f"{x:.2g}"

    def plain(text: str) -> str:  # "vmap(grad)[3][1]" is not a link
        return text.replace("[", "\\[").replace("]", "\\]")

    rows = [(_code(r["test"]), r["bound"], share(r["native"]), share(r["other"]),
             plain(r["worst"]) + (f" (**{r['flag']}**)" if r["flag"] else ""))
            for r in data["rows"]]
    worst = max(((max(x for x in (r["native"], r["other"]) if x is not None), r)
                 for r in data["rows"] if r["bound"] != "token lead"), key=lambda t: t[0])
    return (f"*Measured {machine_line(data['machine'])}, by `make tolerances`: "
            f"{data['bounds']} bounds, "
            f"{data['exceeded']} exceeded, {data['thin']} with less than a "
            f"{1 / data['margin']:.0f}x margin. The largest share of a bound used (token leads "
            f"aside) is {worst[0]:.2g}, by `{worst[1]['test']}` ({plain(worst[1]['worst'])}).*\n\n"
            + _table(["test", "bound", "share used: own kernels", "share used: second set",
                      "the comparison that used the most"], rows))


def _demo(name: str) -> tuple[dict[str, Any], str]:
    record = _read(FIGURES / name / "record.json")
    return record, _read(FIGURES / name / "results.md")


def _took(record: Mapping[str, Any]) -> str:
    """'11.4 minutes (CPU 13.1 minutes; load average 2.70 over the run's last 15 minutes)'."""
    wall = record.get("wall_s")
    if not wall:
        return "time not recorded"
    text = f"{wall / 60:.1f} minutes"
    extra = []
    if record.get("cpu_s"):
        extra.append(f"CPU {record['cpu_s'] / 60:.1f} minutes")
    load = record.get("load") or {}
    if load.get("after_15min") is not None:
        extra.append(f"load average {load['after_15min']:.2f} over the run's last 15 minutes, "
                     f"{load.get('before', 0):.2f} before it")
    return text + (f" ({'; '.join(extra)})" if extra else "")


def figure_demo(name: str) -> str:
    """A demo's report as the run wrote it, under a line saying when, where and how long."""
    record, report = _demo(name)
    levels = [len(h) for h in re.findall(r"^(#+) ", report, flags=re.MULTILINE)]
    shift = 3 - min(levels, default=3)  # its headings sit under the page's section (h2)
    report = re.sub(r"^(#+) ", lambda m: "#" * (len(m.group(1)) + shift) + " ", report,
                    flags=re.MULTILINE)
    # a list straight under a line of text is a list in GitHub's markdown, not in MkDocs'
    report = re.sub(r"^((?!- ).+)\n(?=- )", r"\1\n\n", report, flags=re.MULTILINE)
    return (f"*`{record['command']}`, finished {machine_line(record['machine'])}; "
            f"{_took(record)}. Below, the run's own `results.md` and `results.png` "
            f"(`docs/figures/{name}/`).*\n\n"
            f"![{name}: accuracy by chain length](../figures/{name}/results.png)\n\n{report}")


def figure_demo_record(name: str) -> str:
    record, _report = _demo(name)
    return f"`{record['command']}`, finished {machine_line(record['machine'])}: {_took(record)}"


def seeds_per_minute(record: Mapping[str, Any]) -> tuple[float, float, float]:
    """From a make_demo.json record: the mean wall time of the runs before and after, and
    after's seeds per minute over before's."""
    before = [r for r in record["runs"] if r["side"] == "before"]
    after = [r for r in record["runs"] if r["side"] == "after"]
    mean = [sum(r["wall_s"] for r in rs) / len(rs) for rs in (before, after)]
    return mean[0], mean[1], (after[0]["seeds"] / mean[1]) / (before[0]["seeds"] / mean[0])


def demo_against(record: Mapping[str, Any]) -> str:
    """`make demo` from fresh clones of two commits, one run after another."""
    rows = [(r["started"], r["side"], _code(r["commit"]), r["seeds"], r["venv"],
             f"{r['wall_s']:.1f} s", f"{r['rows_s']} s",
             "not measured" if r["cpu_s"] is None else f"{r['cpu_s']:.0f} s")
            for r in record["runs"]]
    before, after, ratio = seeds_per_minute(record)
    return (f"*Measured {machine_line(record['machine'])}; {record['command']}. Mean wall "
            f"time {before:.0f} s before, {after:.0f} s after: {ratio:.2f}x the seeds per "
            f"minute.*\n\n"
            + _table(["started", "side", "commit", "seeds", "venv", "make demo", "its rows",
                      "CPU"], rows))


def figure_against(name: str) -> str:
    """Before/after tables from ``docs/figures/<name>/``: the training steps of
    `benchmarks/train_step.py --against` (files ``main_*.json``, ``perf_*.json``) and the long
    step's peak of `benchmarks/long_memory.py` run in each checkout (``long_memory_*_before``
    and ``_after``)."""
    folder = FIGURES / name
    steps = [data for f in sorted(folder.glob("*.json")) if not f.name.startswith("long_")
             if "against" in (data := _read(f))]
    demo = folder / "make_demo.json"
    text = demo_against(_read(demo)) + "\n\n" if demo.is_file() else ""
    if not steps:
        raise DocsError(f"docs/figures/{name} holds no train_step.py --against result")
    rows = []
    for data in steps:
        args, peak = data["args"], data["matmul_peak_gflops"]
        side = {(r["ops"], r["dtype"], r["side"]): r for r in data["rows"]}
        for (ops, dtype, who), r in side.items():
            if who != "ours":
                continue
            before = side[(ops, dtype, "before")]
            rows.append((f"{args['preset']}, B {args['batch']}, T {args['seq_len']}",
                         _code(ops), dtype, f"{before['step_s']:.3f} s", f"{r['step_s']:.3f} s",
                         f"{r['before_over_ours']:.2f}",
                         f"{r['gflop'] / r['step_s'] / peak:.0%}"))
    peaks = sorted(round(data["matmul_peak_gflops"]) for data in steps)
    text += (f"*Measured {machine_line(steps[0]['machine'])}; `benchmarks/train_step.py "
             f"--against` (each case in its own process, {steps[0]['args']['rounds']} rounds "
             f"alternating); the last column is the achieved FLOP/s over a float32 matrix "
             f"product measured in the same run ({peaks[0]}-{peaks[-1]} GFLOP/s).*\n\n"
             + _table(["size", "ops", "precision", "before", "after", "before / after",
                       "of the float32 product peak"], rows))
    memory = memory_against(folder)
    return text + ("\n\n" + memory if memory else "")


def memory_against(folder: Path) -> str:
    """The long step's resident peak of `benchmarks/long_memory.py` run in each checkout:
    ``long_memory_<case>_before[_rN].json`` against ``..._after[_rN].json``, one row per case
    and memory mode; several files of a side (rounds run alternating, one process each) give
    a range."""
    cases: dict[str, dict[str, list]] = {}
    for path in sorted(folder.glob("long_memory_*.json")):
        found = re.fullmatch(r"long_memory_(.+)_(before|after)(_r\d+)?", path.stem)
        if found is None:
            raise DocsError(f"{folder.name}/{path.name}: not long_memory_<case>_<side>[_rN]")
        sides = cases.setdefault(found[1], {"before": [], "after": []})
        sides[found[2]].append(_read(path))
    rows, last = [], None
    for case, sides in cases.items():
        if not sides["before"] or not sides["after"]:
            raise DocsError(f"{folder.name}: case {case!r} lacks its before or after file")
        last = sides["after"][0]
        args = last["args"]
        for k, a in enumerate(last["rows"]):
            peaks = [_span(sides[side], k, "peak_above_mb", ",.0f") + " MiB"
                     for side in ("before", "after")]
            steps = [_span(sides[side], k, "seconds", ".2f") + " s"
                     for side in ("before", "after")]
            rows.append((f"{args['preset']}, B {args['batch']}, T {a['seq_len']}"
                         + (", as built" if args.get("as_built") else ""),
                         "off" if args.get("checkpointing") in ("off", False) else "on",
                         a["mode"], *peaks, *steps))
    if not rows:
        return ""
    return (f"*Measured {machine_line(last['machine'])}; `benchmarks/long_memory.py` in each "
            f"checkout, each file the median of its `--rounds` fresh processes (a range: "
            f"several files, run alternating): the resident peak above the steady state, and "
            f"the step's time.*\n\n"
            + _table(["size", "activation checkpointing", "memory mode", "peak before",
                      "peak after", "step before", "step after"], rows))


def _span(files: list, k: int, key: str, fmt: str) -> str:
    """Row ``k``'s ``key`` over the files: one value, or lowest-highest."""
    values = sorted(d["rows"][k][key] for d in files)
    low, high = format(values[0], fmt), format(values[-1], fmt)
    return low if low == high else f"{low}-{high}"


def figure_memory_against(name: str) -> str:
    """`memory_against` for ``docs/figures/<name>/`` alone."""
    text = memory_against(FIGURES / name)
    if not text:
        raise DocsError(f"docs/figures/{name} holds no long_memory.py result")
    return text


def figure_memory_modes(name: str) -> str:
    """`benchmarks/long_memory.py` in several checkouts and memory modes, from
    ``docs/figures/<name>/long_memory_<case>_<checkout>_r<N>.json`` (one fresh process per
    case, checkout and round, rounds run alternating): one row per case, checkout and mode,
    with the range over the rounds, and the peak in units of U = B x T² x D2 x 4 bytes."""
    from folnet.arch import load_preset

    found: dict[tuple[str, str], list] = {}
    for path in sorted((FIGURES / name).glob("long_memory_*.json")):
        match = re.fullmatch(r"long_memory_([a-z]+)_([0-9a-z]+)_r\d+", path.stem)
        if match is None:
            raise DocsError(f"{name}/{path.name}: not long_memory_<case>_<checkout>_r<N>")
        found.setdefault((match[1], match[2]), []).append(_read(path))
    if not found:
        raise DocsError(f"docs/figures/{name} holds no long_memory.py result")
    rows, last = [], None
    for (_case, checkout), files in found.items():
        last = files[0]
        args = last["args"]
        for k, row in enumerate(last["rows"]):
            peaks = sorted(f["rows"][k]["peak_above_mb"] for f in files)
            unit = args["batch"] * row["seq_len"] ** 2 * load_preset(args["preset"])["D2"] * 4
            rows.append((f"{args['preset']}, B {args['batch']}, T {row['seq_len']}",
                         _code(checkout), row["mode"],
                         _span(files, k, "peak_above_mb", ",.0f") + " MiB",
                         f"{peaks[0] * 2**20 / unit:.1f}-{peaks[-1] * 2**20 / unit:.1f} U",
                         _span(files, k, "seconds", ".1f") + " s", len(files)))
    return (f"*Measured {machine_line(last['machine'])}; `benchmarks/long_memory.py` of each "
            f"checkout, one fresh process per round, the rounds alternating between the "
            f"checkouts: the resident peak above the steady state (lowest-highest over the "
            f"rounds) and the step's time.*\n\n"
            + _table(["size", "checkout", "memory mode", "peak above steady", "in U",
                      "step", "rounds"], rows))


# -- the hook -----------------------------------------------------------------------------------

GENERATORS: dict[str, Callable[..., str]] = {
    "cli": cli_reference,
    "console": console,
    "model-config": model_config_reference,
    "presets": presets_table,
    "pretrain-options": pretrain_options,
    "finetune-options": finetune_options,
    "bundled": bundled_files,
    "plan-keys": plan_reference,
    "spec-fields": spec_reference,
    "operators": operators_table,
    "operator-specs": operator_specs,
    "figure-hf-compile": figure_hf_compile,
    "figure-conformance": figure_conformance,
    "figure-conformance-refused": figure_conformance_refused,
    "figure-train-step": figure_train_step,
    "figure-step-tensors": figure_step_tensors,
    "figure-memory-modes": figure_memory_modes,
    "figure-generate": figure_generate,
    "figure-step-census": figure_step_census,
    "figure-step-bytes": figure_step_bytes,
    "figure-layer-trace": figure_layer_trace,
    "figure-kinship-generation": figure_kinship_generation,
    "figure-compile-step": figure_compile_step,
    "figure-generate-static": figure_generate_static,
    "figure-tolerances": figure_tolerances,
    "step-estimate": step_estimate,
    "figure-decoder-text": figure_decoder_text,
    "figure-demo": figure_demo,
    "figure-demo-record": figure_demo_record,
    "figure-against": figure_against,
    "figure-memory-against": figure_memory_against,
}


def render(markdown: str, where: str = "<page>") -> str:
    """``markdown`` with every marker replaced by what it names."""

    def replace(match: re.Match[str]) -> str:
        name, arg = match.group(1), match.group(2)
        make = GENERATORS.get(name)
        if make is None:
            raise DocsError(f"{where}: unknown marker folnet:{name}; known: {sorted(GENERATORS)}")
        try:
            return make(arg) if arg else make()
        except DocsError as exc:
            raise DocsError(f"{where}: folnet:{name}: {exc}") from None

    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return render(markdown, page.file.src_uri)
