"""The ``folnet`` command line as a newcomer meets it: --version, help that shows every option
with the defaults a run really uses, errors in the sub-command's own usage, a failed run that
leaves nothing behind, and one closing line."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import re
import subprocess
import sys

import pytest
import torch
from paths import ROOT
from runs import cli_error

import folnet
from folnet.cli import DefaultsFormatter, build_parser, main
from folnet.train.finetune.config import load_finetune_config
from folnet.train.options import format_default
from folnet.train.pretrain.config import load_pretrain_config

COMMANDS = ("ops", "env", "info", "convert", "pretrain", "finetune", "evaluate", "ablate")


def _wide_help(parser: argparse.ArgumentParser) -> str:
    """The parser's help with one line per option (no wrapping), for line-wise checks."""
    parser.formatter_class = lambda prog: DefaultsFormatter(prog, width=2000,
                                                            max_help_position=1000)
    return parser.format_help()


def _option_lines(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each option's (or positional's) invocation -> its help text ('' when it has none)."""
    lines: dict[str, str] = {}
    sections = _wide_help(parser).split("\n\n")
    for section in sections:
        head, *entries = section.splitlines()
        if head not in ("options:", "positional arguments:"):
            continue
        for entry in entries:
            match = re.fullmatch(r"  (\S(?:.*?\S)?)(?: {2,}(.*))?", entry)
            assert match, entry
            lines[match.group(1)] = match.group(2) or ""
    return lines


def test_version_comes_from_the_package(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"folnet {folnet.__version__}\n"
    try:
        installed = importlib.metadata.version("folnet")
    except importlib.metadata.PackageNotFoundError:  # running from a plain checkout
        return
    assert installed == folnet.__version__


def test_every_option_of_every_command_has_help():
    _parser, parsers = build_parser()
    assert set(parsers) == set(COMMANDS)
    for name, parser in parsers.items():
        options = _option_lines(parser)
        assert options, name
        bare = [invocation for invocation, text in options.items() if not text.strip()]
        assert not bare, f"folnet {name}: options without help: {bare}"


@pytest.mark.parametrize("command, load", [("pretrain", load_pretrain_config),
                                            ("finetune", load_finetune_config)])
def test_help_shows_the_defaults_a_run_starts_from(command, load):
    """Every option with a plain default shows the value the loader gives a run that sets
    nothing (the dataclass's, under the empty defaults file)."""
    _parser, parsers = build_parser(command)
    options = _option_lines(parsers[command])
    run = load()
    shown = 0
    for f in dataclasses.fields(run):
        value = getattr(run, f.name)
        if value is None or isinstance(value, tuple) or f.name == "operators":
            continue
        flag = type(run).flag(f.name)
        (text,) = [t for inv, t in options.items() if inv.split()[0].rstrip(",") == flag]
        assert text.endswith(f"(default: {format_default(value)})"), (flag, text)
        shown += 1
    assert shown >= 20


def test_the_defaults_file_reaches_the_help(tmp_path, monkeypatch):
    """A value the defaults file sets is the default the help shows (a distributor's change
    reaches --help as it reaches the run)."""
    import folnet.train.pretrain.config as pretrain_config

    changed = tmp_path / "pretrain.toml"
    changed.write_text("lr = 0.25\n")
    monkeypatch.setattr(pretrain_config, "default_config_path", lambda: changed)
    _parser, parsers = build_parser("pretrain")
    assert _option_lines(parsers["pretrain"])["--lr X"].endswith("(default: 0.25)")
    assert load_pretrain_config().lr == 0.25


def test_plain_options_show_their_defaults_too():
    _parser, parsers = build_parser("info")
    options = _option_lines(parsers["info"])
    assert options["--seq-len N"].endswith("(default: 128)")
    assert options["--preset PRESET"].endswith("(default: base)")
    assert "None" not in " ".join(options.values())  # a flag that is unset says what happens


@pytest.mark.parametrize(("argv", "line"), [
    (["pretrain", "--bogus"], "folnet pretrain: error: unrecognized option '--bogus'; see "
                              "folnet pretrain --help"),
    (["pretrain", "--step", "2"], "folnet pretrain: error: unrecognized option '--step'; did "
                                  "you mean --steps?"),  # not taken as --steps
    (["pretrain", "--kinship-doc=4"], "folnet pretrain: error: unrecognized option "
                                      "'--kinship-doc'; did you mean --kinship-documents?"),
    (["info", "jmc.atp", "--presets", "tiny"], "folnet info: error: unrecognized option "
                                               "'--presets'; did you mean --preset?"),
    (["evaluate", "--model", "m", "--out", "o", "--split", "x"],
     "folnet evaluate: error: unrecognized option '--split'; did you mean --splits?"),
])
def test_an_unknown_or_abbreviated_option_is_one_line_with_the_closest(argv, line, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == line + "\n"


@pytest.mark.parametrize(("word", "line"), [
    ("pretrian", "folnet: error: unknown command 'pretrian'; did you mean 'pretrain'?"),
    ("zzz", "folnet: error: unknown command 'zzz'; use 'ablate', 'convert', 'env', "
            "'evaluate', 'finetune', 'info', 'ops' or 'pretrain'"),
])
def test_an_unknown_command_is_one_line_with_the_closest(word, line, capsys):
    assert main([word]) == 2
    assert capsys.readouterr().err == line + "\n"


def test_help_imports_only_what_it_shows():
    """Listing the commands must not load torch or any command's options."""
    code = ("import sys\nfrom folnet.cli import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\nprint(sorted(m for m in ('torch', 'tokenizers', "
            "'folnet.arch', 'folnet.train.pretrain.config') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
        str(ROOT), os.environ.get("PYTHONPATH"))))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env).stdout
    assert out.splitlines()[-1] == "[]"


def _tiny_pretrain(out, *extra: str) -> list[str]:
    return ["pretrain", "--preset", "tiny", "--data", "kinship", "--kinship-documents", "30",
            "--vocab-size", "120", "--seq-len", "32", "--batch-size", "4", "--steps", "2",
            "--log-every", "1", "--no-progress", "--out", str(out), *extra]


@pytest.mark.usefixtures("one_thread")
def test_a_failed_pretrain_writes_nothing_and_the_retry_runs(tmp_path, capsys):
    out = tmp_path / "run"
    bad = {"--data": ["--data", str(tmp_path / "missing.txt")],
           "--tokenizer": ["--tokenizer", str(tmp_path / "missing.json")],
           "D2": ["--model", "D2=0"], "operator": ["--ops", "q.q"], "preset": ["--preset", "huge"]}
    for needle, flags in bad.items():
        assert main([*_tiny_pretrain(out), *flags]) == 2, needle
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err
        assert not out.exists(), f"{needle}: a failed run left {sorted(out.rglob('*'))}"
    assert main(_tiny_pretrain(out)) == 0
    stdout = capsys.readouterr().out
    final = out / "final"
    assert (final / "config.json").is_file()
    closing = [line for line in stdout.splitlines() if str(final) in line]
    assert closing == [f"done: 2 steps; final model and tokenizer in {final}"]


def test_env_names_what_a_bug_report_needs(capsys):
    assert main(["env"]) == 0
    lines = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["folnet"].startswith(f"{folnet.__version__} (")
    assert lines["torch"].startswith(torch.__version__)
    assert lines["CPU kernels"].startswith(torch.backends.cpu.get_cpu_capability())
    assert ("CUDA" in lines) != torch.cuda.is_available()
    assert lines["transformers"] == importlib.metadata.version("transformers")
    try:
        assert lines["xformers"] == importlib.metadata.version("xformers")
    except importlib.metadata.PackageNotFoundError:
        assert lines["xformers"] == "not installed"


def test_a_bundled_name_is_a_config_and_a_plan_and_a_miss_lists_them(tmp_path, capsys):
    from folnet.read_files import bundled_or_path, specs_dir
    from folnet.train.ablate.plan import load_plan
    from folnet.train.pretrain.config import load_pretrain_config as load_config

    assert bundled_or_path("kinship-tiny", "train", what="--config") == (
        specs_dir() / "train" / "kinship-tiny.toml")
    assert load_config("kinship-tiny").ops == "j.at"
    assert load_plan("demo").name == "demo"
    mine = tmp_path / "kinship-tiny"  # a file of the user's wins over the bundled name
    mine.write_text('ops = "j.a"\n')
    assert load_config(mine).ops == "j.a"
    for wrong in ("kinship-tiny.toml", "train/kinship-tiny", "no-such"):
        err = cli_error(capsys, ["pretrain", "--config", wrong, "--out", str(tmp_path / "o")])
        assert f"--config {wrong!r} does not exist" in err
        assert "kinship-tiny, pretrain" in err
