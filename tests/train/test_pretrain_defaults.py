"""Each pretraining default is written once.

The data options (``seq_len``, ``objective``, ``mlm_probability``, ...) take their defaults from
`PretrainDataConfig`; ``folnet/specs/train/pretrain.toml`` repeats only the run's own options. These
tests compare the real objects (the dataclasses, the defaults file, the loader ``folnet
pretrain`` uses and its ``--help``), never numbers copied here, and the last two show that the
checks fail on a drifted copy and that a default changed in its one place reaches the run and
its help.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from paths import ROOT

from folnet.cli import DefaultsFormatter, build_parser
from folnet.train.data.config import PretrainDataConfig
from folnet.train.options import format_default, read_toml
from folnet.train.pretrain.config import PretrainConfig, default_config_path, load_pretrain_config

#: The options the issue names; each must be one that the two dataclasses share.
NAMED = ("seq_len", "objective", "mlm_probability", "max_predictions", "kinship_documents",
         "encoding", "text_column", "streaming")


def _defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls)}


def _shared(run_cls: type, data_cls: type) -> list[str]:
    return sorted(set(_defaults(run_cls)) & set(_defaults(data_cls)))


def _drifted(run_cls: type, data_cls: type) -> list[str]:
    """Shared options whose default differs, as declared or as the built objects hold it."""
    run, data = run_cls(), data_cls()
    return [name for name in _shared(run_cls, data_cls)
            if _defaults(run_cls)[name] != _defaults(data_cls)[name]
            or getattr(run, name) != getattr(data, name)]


def _repeated(defaults_file: Mapping[str, Any]) -> list[str]:
    """Keys of a defaults file that copy a default `PretrainDataConfig` already holds."""
    return sorted(set(defaults_file) & set(_defaults(PretrainDataConfig)))


def _help_lines(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each field's help line, unwrapped (a wrap could split ``kinship-symbolic``)."""
    parser.formatter_class = lambda prog: DefaultsFormatter(prog, width=2000,
                                                            max_help_position=1000)
    text = parser.format_help()
    lines = {}
    for name in _defaults(PretrainConfig):
        flag = PretrainConfig.flag(name)
        (line,) = [ln for ln in text.splitlines() if ln.lstrip().startswith(flag + " ")
                   or ln.lstrip().startswith(flag + ",")]
        lines[name] = line
    return lines


def _help_mismatches(lines: Mapping[str, str], expected: PretrainConfig) -> list[str]:
    """Options with a default whose help line does not end with ``expected``'s value."""
    bad = []
    for name in _defaults(PretrainConfig):
        value = getattr(expected, name)
        if value is None or value == ():  # unset: the help says what happens instead
            continue
        if not lines[name].endswith(f"(default: {format_default(value)})"):
            bad.append(name)
    return bad


def _pretrain_help() -> dict[str, str]:
    _parser, parsers = build_parser("pretrain")
    return _help_lines(parsers["pretrain"])


def test_shared_options_take_their_default_from_the_data_config():
    shared = _shared(PretrainConfig, PretrainDataConfig)
    assert set(NAMED) <= set(shared), shared
    assert _drifted(PretrainConfig, PretrainDataConfig) == []


def test_the_defaults_file_does_not_repeat_the_data_defaults():
    assert _repeated(read_toml(default_config_path())) == []


def test_every_option_a_run_uses_is_its_documented_default():
    """The file's value where it sets one (equal to the dataclass default), else the
    dataclass default, which for a data option is `PretrainDataConfig`'s."""
    run, built_in, data = load_pretrain_config(), PretrainConfig(), PretrainDataConfig()
    in_file = read_toml(default_config_path())
    for name in _defaults(PretrainConfig):
        used = getattr(run, name)
        source = in_file[name] if name in in_file else getattr(built_in, name)
        assert (used, type(used)) == (source, type(source)), name
        assert (used, type(used)) == (getattr(built_in, name), type(getattr(built_in, name)))
        if hasattr(data, name) and name != "cache_dir":  # None means OUT/cache in a run
            assert used == getattr(data, name), name


def test_help_shows_the_default_of_every_option():
    lines = _pretrain_help()
    assert _help_mismatches(lines, load_pretrain_config()) == []
    data = PretrainDataConfig()
    for name in NAMED:  # the data options, against the one place their default is written
        assert lines[name].endswith(f"(default: {format_default(getattr(data, name))})"), name


def test_the_checks_catch_a_drifted_copy():
    """Each check above, given one drifted copy, names exactly that option (over whatever it
    names for the real objects, so this test fails only when a check has lost its teeth)."""

    @dataclasses.dataclass(frozen=True)
    class DriftedRun(PretrainConfig):
        seq_len: int = PretrainDataConfig().seq_len * 2

    baseline = set(_drifted(PretrainConfig, PretrainDataConfig))
    assert set(_drifted(DriftedRun, PretrainDataConfig)) - baseline == {"seq_len"}
    in_file = read_toml(default_config_path())
    copied = {**in_file, "objective": PretrainDataConfig().objective}
    # even a copy equal to the default is one copy too many
    assert set(_repeated(copied)) - set(_repeated(in_file)) == {"objective"}
    lines, run = _pretrain_help(), load_pretrain_config()
    other = run.replace(max_predictions=run.max_predictions + 1,
                        encoding="ascii" if run.encoding != "ascii" else "utf-8")
    assert (set(_help_mismatches(lines, other)) - set(_help_mismatches(lines, run))
            == {"encoding", "max_predictions"})


def test_a_data_default_changed_in_its_one_place_reaches_the_run_and_its_help():
    """Change `PretrainDataConfig`'s defaults before the run options are defined (a fresh
    interpreter): the dataclass, the loader and ``folnet pretrain --help`` all follow."""
    code = """if True:
        import dataclasses, sys
        import folnet.train.data.config as data
        assert "folnet.train.pretrain.config" not in sys.modules

        @dataclasses.dataclass(frozen=True)
        class Changed(data.PretrainDataConfig):
            seq_len: int = 96
            objective: str = "sop"
            max_predictions: int = 7

        data.PretrainDataConfig = Changed
        from folnet.cli import main
        from folnet.train.pretrain.config import PretrainConfig, load_pretrain_config
        for config in (PretrainConfig(), load_pretrain_config()):
            assert (config.seq_len, config.objective, config.max_predictions) == (96, "sop", 7)
        main(["pretrain", "--help"])
    """
    env = {**os.environ, "COLUMNS": "2000", "PYTHONPATH": os.pathsep.join(filter(None, (
        str(ROOT), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    help_text = " ".join(done.stdout.split())
    for text in ("tokens per sequence (default: 96)", "span (span corruption) (default: sop)",
                 "targets per sequence (default: 7)"):
        assert text in help_text


def _copies(values: Mapping[str, Any], defaults: Any) -> list[str]:
    """Keys of a TOML layer that only repeat ``defaults``' value (one copy too many)."""
    return sorted(k for k, v in values.items()
                  if not isinstance(v, Mapping) and getattr(defaults, k, object()) == v)


def test_no_file_repeats_a_dataclass_default():
    """The run options' defaults are the dataclasses'; a defaults file or a model preset sets
    only what differs (FOLNet-Base is `ModelConfig`'s own defaults)."""
    from folnet.arch import PRESETS, ModelConfig
    from folnet.train.finetune.config import FinetuneConfig
    from folnet.train.finetune.config import default_config_path as finetune_file
    from folnet.train.options import specs_file

    layers = [(read_toml(default_config_path()), PretrainConfig()),
              (read_toml(finetune_file()), FinetuneConfig())]
    layers += [(read_toml(specs_file("models", f"{name}.toml")), ModelConfig())
               for name in PRESETS]
    assert [_copies(values, defaults) for values, defaults in layers] == [[]] * len(layers)
    # and the check sees a copy: a preset that restates the default dropout
    tiny = read_toml(specs_file("models", "tiny.toml"))
    assert _copies({**tiny, "dropout": ModelConfig().dropout}, ModelConfig()) == ["dropout"]
    assert _copies({"steps": PretrainConfig().steps}, PretrainConfig()) == ["steps"]
