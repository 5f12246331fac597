"""A hostile config.json loads in under a second or is refused with one FolnetError line.

Model directories come from other people, and a config.json carries the specs of its custom
operators, whose size and scale expressions are evaluated with the model's dimensions. Before,
``"9**9**9"`` hung, ``"D2/0"``, ``"D2*1e308*10"`` and ``"(0-8)**0.5"`` raised raw Python
errors, and ``"D2**999999"``, ``"D2*2**62"`` and ``"num_labels": 2**63`` crashed inside torch
("Overflow when unpacking long long"). Each case here saves a tiny model with a custom
operator, edits its config.json and loads it: the answer must be a `FolnetError` within a
second whose one line names config.json, the field and the expression.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import torch
from model_dirs import edited_copy, setter

import folnet
from folnet.arch.config import SIZE_LIMITS
from folnet.arch.io import model_dir as checkpoint
from folnet.ops import sizes

#: The custom operator the saved model carries (``q``: B <- B x U, channels h and w).
BPROD = {"symbol": "q", "name": "bprod", "typing": "B <- B x U", "kernel": "x y w",
         "premise": "x h w", "output": "x y h", "bdim": "x", "rdim": "w",
         "sizes": {"h": "H", "w": "S"}}
V = 97
#: The bound of a head's output count (`folnet.arch.config.NUM_LABELS_LIMIT`: the vocabulary's).
NUM_LABELS_LIMIT = 2**24

DEEP = "(" * 10000 + "D2" + ")" * 10000
LONG = "+".join(["D2"] * 50000)

#: (id, expression for the size of channel h, words the message must contain)
SIZE_CASES = [
    ("power-tower", "9**9**9", ["exponent 387420489 exceeds the limit 64"]),
    ("divide-by-zero", "D2/0", ["division by zero"]),
    ("float-overflow", "D2*1e308*10", ["1e+308", "magnitude limit"]),
    ("complex", "(0-8)**0.5", ["not a real number"]),
    ("huge-exponent", "D2**999999", ["exponent 999999 exceeds the limit 64"]),
    ("int64-overflow", "D2*2**62", ["2**62 exceeds the magnitude limit"]),
    ("deep-nesting", DEEP, ["20002 characters", "limit of 256 characters"]),
    ("long", LONG, ["149999 characters", "limit of 256 characters"]),
    ("negative", "-D2", ["evaluates to -16", "[1, 67108864"]),
    ("zero", "0*D2", ["evaluates to 0,", "[1, 67108864"]),
    ("fraction", "D2/3", ["evaluates to 5.33", "[1, 67108864"]),
    ("too-wide", "2**26+1", ["evaluates to 67108865", "[1, 67108864"]),
    ("many-terms", "+".join(["1"] * 40), ["79 terms", "limit 64"]),
    ("deep-terms", "(1+" * 20 + "D2" + ")" * 20, ["nested 21 deep", "limit 16"]),
    ("nan", "1e999-1e999", ["magnitude limit"]),
]

SCALE_CASES = [
    ("divide-by-zero", "1/0", ["division by zero"]),
    ("zero", "0*S", ["evaluates to 0", "[2**-53, 2**53]"]),
    ("negative", "-S**-0.25", ["evaluates to -0.5,", "[2**-53, 2**53]"]),
    ("power-tower", "S**9**9", ["exponent 387420489 exceeds the limit 64"]),
    ("underflow-to-zero", "(S**-64)**64", ["evaluates to 0.0,", "[2**-53, 2**53]"]),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A tiny classifier whose layers use the custom operator q, saved (config.json carries
    q's spec), and q unregistered again: loading must register it from the file."""
    directory = tmp_path_factory.mktemp("hostile") / "good"
    folnet.register_operator(**BPROD)
    try:
        torch.manual_seed(0)
        model = folnet.build_model("j.aq", preset="tiny", vocab_size=V, head="classification",
                                   num_labels=3)
        model.save_pretrained(directory)
    finally:
        folnet.unregister_operator("q")
    return directory


def _refused(directory: Path) -> str:
    """Load ``directory``: it must fail with a FolnetError within a second; its message."""
    start = time.perf_counter()
    with pytest.raises(folnet.FolnetError) as info:
        folnet.from_pretrained(directory)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"refusing took {elapsed:.2f} s"
    message = str(info.value)
    assert "\n" not in message and len(message) < 1000
    assert str(directory / "config.json") in message
    return message


def _quoted(expression: str) -> str:
    """How a message quotes an expression: whole, or its first 40 characters when long."""
    return repr(expression) if len(expression) <= 60 else repr(expression[:40])


def _operator(meta: dict) -> dict:
    (spec,) = meta["model"]["operators"]
    return spec


@pytest.mark.parametrize(("expression", "words"), [c[1:] for c in SIZE_CASES],
                         ids=[c[0] for c in SIZE_CASES])
def test_a_hostile_size_expression_is_refused_fast_in_one_line(saved, tmp_path, expression,
                                                                words):
    directory = edited_copy(saved, tmp_path,
                            lambda meta: _operator(meta)["sizes"].__setitem__("h", expression))
    message = _refused(directory)
    assert "operators[0]: operator 'q' (bprod): field 'sizes': h" in message
    assert _quoted(expression) in message
    for word in words:
        assert word in message
    with pytest.raises(folnet.FolnetError, match="unknown operator 'q'"):
        folnet.get_operator("q")  # refused before anything was registered


@pytest.mark.parametrize(("expression", "words"), [c[1:] for c in SCALE_CASES],
                         ids=[c[0] for c in SCALE_CASES])
def test_a_hostile_scale_expression_is_refused_fast_in_one_line(saved, tmp_path, expression,
                                                                 words):
    role = random.Random(expression).choice(["kernel_proj", "premise_proj"])
    directory = edited_copy(saved, tmp_path,
                            lambda meta: _operator(meta)[role].__setitem__("scale", expression))
    message = _refused(directory)
    assert f"operator 'q' (bprod): field {role!r}: 'scale'" in message
    assert repr(expression) in message
    for word in words:
        assert word in message


@pytest.mark.parametrize("value", [2**63, 2**31, NUM_LABELS_LIMIT + 1, 0, -3, True, 2.0, "2"],
                         ids=repr)
def test_a_hostile_num_labels_is_refused_fast_in_one_line(saved, tmp_path, value):
    directory = edited_copy(saved, tmp_path, setter("num_labels", value))
    message = _refused(directory)
    assert f"field 'num_labels' must be an integer in [1, {NUM_LABELS_LIMIT}], got {value!r}" \
        in message


def test_a_label_map_larger_than_the_limit_is_refused(saved, tmp_path, monkeypatch):
    """transformers' id2label stands for num_labels when that is missing; the limit is
    lowered here, since a real 2**24-entry map is a 300 MB file."""
    monkeypatch.setattr(checkpoint, "NUM_LABELS_LIMIT", 5, raising=False)

    def change(meta):
        del meta["num_labels"]
        meta["id2label"] = {str(i): f"label {i}" for i in range(6)}

    directory = edited_copy(saved, tmp_path, change)
    message = _refused(directory)
    assert "field 'id2label' has 6 entries, more than the limit 5" in message


INT_FIELDS = sorted(SIZE_LIMITS)


@pytest.mark.parametrize("field", INT_FIELDS)
@pytest.mark.parametrize("kind", ["int64", "above", "bool", "float"])
def test_every_integer_model_field_is_range_checked_before_torch(saved, tmp_path, field, kind):
    limit = SIZE_LIMITS[field]
    value = {"int64": 2**63, "above": limit + 1, "bool": True, "float": 8.0}[kind]
    directory = edited_copy(saved, tmp_path, setter(f"model.{field}", value))
    message = _refused(directory)
    assert f"model.{field} must be an integer in [1, {limit}], got {value!r}" in message


def test_an_untouched_directory_loads_and_computes_the_same(saved):
    """The checks refuse nothing valid: the saved model loads and agrees with itself on random
    non-zero inputs, and the sizes the file implies are those the expressions say."""
    first = folnet.from_pretrained(saved).eval()
    assert folnet.get_operator("q").sizes == (("h", "H"), ("w", "S"))
    folnet.unregister_operator("q")
    second = folnet.from_pretrained(saved).eval()
    generator = torch.Generator().manual_seed(random.randrange(2**31))
    ids = torch.randint(5, V, (2, 9), generator=generator)
    with torch.no_grad():
        assert torch.equal(first(ids).logits, second(ids).logits)
    assert first(ids).logits.shape == (2, 3)


def test_expressions_within_the_bounds_evaluate_as_python_does():
    rng = random.Random(281)
    for _ in range(50):
        dims = {name: rng.randint(1, 2**12) for name in sizes.DIM_NAMES}
        h, s, d2 = dims["H"], dims["S"], dims["D2"]
        assert sizes.evaluate("H*S", dims) == h * s
        assert sizes.evaluate("2*D2 + H - 1", dims) == 2 * d2 + h - 1
        assert sizes.evaluate("(H*S)//D2", dims) == (h * s) // d2
        assert sizes.evaluate("S**-0.25", dims) == pytest.approx(s**-0.25, rel=1e-15)
        assert sizes.evaluate("2**53 - H", dims) == 2**53 - h
        assert sizes.evaluate_int("H*S", dims, what="w") == h * s
        exponent = rng.randint(-4, 4) or 1
        assert sizes.evaluate(f"D2**{exponent}", dims) == pytest.approx(d2**exponent,
                                                                          rel=1e-15)


@pytest.mark.parametrize(("expression", "words"), [
    ("2**53+1", "9007199254740993 exceeds the magnitude limit"),
    ("0**-1", "division by zero"),
    ("D2//0", "division by zero"),
    ("D2**-65", "exponent -65 is below the limit -64"),
    ("(1e-300)**-1", "exceeds the magnitude limit"),
    ("1e-300**-0.5", "exceeds the magnitude limit"),
    ("D2\x00", "cannot parse"),
    ("D2 % 3", "Mod not allowed"),
    ("abs(D2)", "Call not allowed"),
])
def test_evaluate_refuses_before_computing(expression, words):
    start = time.perf_counter()
    with pytest.raises(folnet.FolnetError) as info:
        sizes.evaluate(expression, {"D2": random.randint(1, 64)}, what="operator 'z': field x")
    assert time.perf_counter() - start < 1.0
    assert words in str(info.value) and "operator 'z': field x" in str(info.value)


def test_registering_or_building_with_a_hostile_expression_is_refused():
    """The Python API meets the same bounds: a constant expression is refused when the spec is
    registered, one over the dimensions when a model is built, and a head output count torch
    cannot take when the model is built or loaded."""
    start = time.perf_counter()
    with pytest.raises(folnet.FolnetError, match=r"field 'sizes': h: expression '9\*\*9\*\*9': "
                                                 r"exponent 387420489 exceeds the limit 64"):
        folnet.register_operator(**{**BPROD, "sizes": {"h": "9**9**9"}})
    folnet.register_operator(**{**BPROD, "sizes": {"h": "D2**999999"}})
    with pytest.raises(folnet.FolnetError, match=r"operator 'q' \(bprod\): field 'sizes': "
                                                 r"h = 'D2\*\*999999': exponent 999999 exceeds"):
        folnet.build_model("j.aq", preset="tiny", vocab_size=V)
    with pytest.raises(folnet.FolnetError, match=rf"num_labels must be an integer in \[1, "
                                                 rf"{NUM_LABELS_LIMIT}\], got {2**63}"):
        folnet.build_model("j.a", preset="tiny", vocab_size=V, head="classification",
                           num_labels=2**63)
    assert time.perf_counter() - start < 2.0


def test_a_new_head_with_a_hostile_num_labels_is_refused(saved):
    with pytest.raises(folnet.FolnetError, match=rf"num_labels must be an integer in \[1, "
                                                 rf"{NUM_LABELS_LIMIT}\], got {2**63}"):
        folnet.from_pretrained(saved, head="token-classification", num_labels=2**63)


def test_transformers_loading_names_the_file_too(saved, tmp_path):
    pytest.importorskip("transformers")
    from folnet.hf import FolnetForSequenceClassification

    for name, change in (
            ("size", lambda meta: _operator(meta)["sizes"].__setitem__("h", "9**9**9")),
            ("labels", setter("num_labels", 2**63))):
        directory = edited_copy(saved, tmp_path / name, change)
        start = time.perf_counter()
        with pytest.raises(folnet.FolnetError) as info:
            FolnetForSequenceClassification.from_pretrained(str(directory))
        assert time.perf_counter() - start < 1.0
        message = str(info.value)
        assert str(directory / "config.json") in message and "\n" not in message
        assert ("exponent 387420489" if name == "size" else str(2**63)) in message


def test_the_command_line_refuses_a_hostile_init_from_with_exit_2(saved, tmp_path, capsys):
    for module in ("tokenizers", "tqdm", "datasets"):  # what `folnet pretrain` requires
        pytest.importorskip(module)
    from folnet.cli import main

    directory = edited_copy(saved, tmp_path,
                            lambda meta: _operator(meta)["sizes"].__setitem__("h", "9**9**9"))
    out = tmp_path / "run"
    capsys.readouterr()
    start = time.perf_counter()
    code = main(["pretrain", "--preset", "tiny", "--data", "kinship", "--steps", "3",
                 "--no-progress", "--no-tensorboard", "--out", str(out),
                 "--init-from", str(directory)])
    elapsed = time.perf_counter() - start
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("folnet pretrain:")]
    assert len(lines) == 1 and "Traceback" not in err
    assert str(directory / "config.json") in lines[0] and "exponent 387420489" in lines[0]
    assert elapsed < 5.0 and not out.exists()
