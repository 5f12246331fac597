"""Spec parsing and validation (a table of bad specs), the registry, custom operators, CLI."""

from __future__ import annotations

import pytest
from loops import loop_bprod, loop_trans_first
from opdata import inputs
from tolerances import assert_close

import folnet
from folnet.cli import main as cli_main
from folnet.ops.compiler import compile_operator
from folnet.ops.registry import parse_spec_file
from folnet.ops.spec import parse_spec, parse_typing, spec_to_dict

GOOD = {
    "symbol": "q", "name": "bprod", "typing": "B <- B x U",
    "kernel": "x y w", "premise": "x h w", "output": "x y h",
    "bdim": "x", "rdim": "w",
}


def bad(**changes):
    data = dict(GOOD)
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    return data


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (bad(typing="U <- B"), r"operator 'q' \(bprod\): field 'typing': cannot parse 'U <- B'"),
        (bad(typing="U <- B x U"),
         r"field 'kernel': typing U <- B x U makes the kernel binary .* but 'x y w' has 2"
         r"|field 'output': typing U <- B x U makes the output unary \(1 token index\), but"),
        (bad(kernel="x w"), r"field 'kernel': .*makes the kernel binary \(2 token index\), but "
                            r"'x w' has 1"),
        (bad(premise="x y h w"), r"field 'premise': .*unary .*has 2"),
        (bad(kernel="x y q"), r"field 'kernel': unknown index letter\(s\) \['q'\]"),
        (bad(kernel="x y y"), r"field 'kernel': index list 'x y y' repeats a letter"),
        (bad(rdim="h"), r"field 'rdim': 'h' must appear in the kernel \('x y w'\) and the "
                        r"premise \('x h w'\) and not in the output"),
        (bad(rdim="x"), r"field 'rdim': 'x' must appear .* and not in the output"),
        (bad(bdim="y"), r"field 'bdim': 'y' must appear in the kernel \('x y w'\), the premise "
                        r"\('x h w'\) and the output"),
        (bad(bdim="zz"), r"field 'bdim': expected one index letter"),
        (bad(output="x y h s"), r"field 'output': index letter\(s\) \['s'\] appear in no input"),
        (bad(activation="relu"), r"field 'activation': expected 'identity' or 'softmax', got "
                                 r"'relu'"),
        (bad(mask=["premise"]), r"field 'mask': a causal mask applies to binary tensors only; "
                                r"the premise \('x h w'\) is unary"),
        (bad(mask=["output"]), r"field 'mask': expected a list of 'kernel' or 'premise'"),
        (bad(sizes={"q": "H"}), r"field 'sizes': 'q' is not a channel letter"),
        (bad(sizes={"h": "H*Z"}), r"field 'sizes': h: unknown name 'Z'"),
        (bad(symbol="QQ"), r"field 'symbol': expected one lowercase letter, got 'QQ'"),
        (bad(name="two words"), r"field 'name': expected an identifier"),
        (bad(rdim=None), r"missing required field 'rdim'"),
        (bad(colour="blue"), r"unknown field\(s\) \['colour'\]"),
        (bad(kernel_proj={"bias": "yes"}), r"field 'kernel_proj': 'bias' must be true or false"),
        (bad(premise_proj={"scale": "S**-0.25; import os"}), r"field 'premise_proj': 'scale'"),
        (bad(realisation="cuda"), r"field 'realisation': expected 'einsum' or 'ffn'"),
        (bad(kernel="x y w h", premise="x w", output="x y"),
         r"field 'rdim': letter\(s\) \['h'\] are summed out but are not the R-dim 'w'"),
    ],
)
def test_invalid_specs_have_clear_errors(data, match):
    with pytest.raises(folnet.FolnetError, match=match):
        parse_spec(data)


def test_errors_are_value_errors():
    with pytest.raises(ValueError):
        parse_spec(bad(activation="relu"))


def test_duplicate_symbol_or_name_in_a_file():
    one = ('[[operator]]\nsymbol = "q"\nname = "bprod"\ntyping = "B <- B x U"\n'
           'kernel = "x y w"\npremise = "x h w"\noutput = "x y h"\nbdim = "x"\nrdim = "w"\n')
    with pytest.raises(folnet.FolnetError, match=r"field 'symbol': duplicate of 'q'"):
        parse_spec_file(one + one)
    other = one.replace('symbol = "q"', 'symbol = "r"')
    with pytest.raises(folnet.FolnetError, match=r"field 'name': duplicate of operator 'q'"):
        parse_spec_file(one + other)


def test_a_file_may_name_its_tables_as_a_plan_does():
    one = ('[[operator]]\nsymbol = "q"\nname = "bprod"\ntyping = "B <- B x U"\n'
           'kernel = "x y w"\npremise = "x h w"\noutput = "x y h"\nbdim = "x"\nrdim = "w"\n')
    (spec,) = parse_spec_file(one.replace("[[operator]]", "[[operators]]"))
    assert spec == parse_spec_file(one)[0] and spec.symbol == "q"
    with pytest.raises(folnet.FolnetError, match=r"both \[\[operator\]\] and \[\[operators\]\]"):
        parse_spec_file(one + one.replace("[[operator]]", "[[operators]]"))


def test_typing_parser_accepts_variants():
    for text in ("U <- B x U", "U<-BxU", "U ← B × U"):
        assert str(parse_typing(text)) == "U <- B x U"
    with pytest.raises(folnet.FolnetError, match="expected 'OUT <- KERNEL x PREMISE'"):
        parse_typing("U <- C x U")


def test_builtins_are_table_2():
    rows = {s.symbol: (s.name, str(s.typing), s.bdim, s.rdim, s.activation)
            for s in folnet.operators()}
    assert rows == {
        "b": ("bool", "U <- U x U", "x", "w", "identity"),
        "c": ("cjoin", "U <- U x B", "s", "a", "softmax"),
        "j": ("join", "U <- B x U", "h", "a", "softmax"),
        "m": ("mu", "U <- B x B", "x", "a", "softmax"),
        "a": ("assoc", "B <- U x U", "h", "w", "identity"),
        "p": ("prod", "B <- U x B", "x", "w", "identity"),
        "t": ("trans", "B <- B x B", "h", "a", "softmax"),
    }
    assert folnet.get_operator("t").mask == ("kernel", "premise")
    assert folnet.get_operator("j").formula == "u_hs(x) = sum_a K_h(x,a) v_hs(a)"


def test_spec_is_frozen_and_round_trips():
    spec = folnet.get_operator("join")
    with pytest.raises(AttributeError):
        spec.symbol = "z"
    assert parse_spec(spec_to_dict(spec)) == spec


def test_unknown_operator_lists_known_ones():
    with pytest.raises(folnet.FolnetError, match=r"unknown operator 'z'.*j \(join\)"):
        folnet.get_operator("z")


@pytest.fixture
def registered():
    made = []
    yield made
    for symbol in made:
        folnet.unregister_operator(symbol)


@pytest.mark.numerics
def test_register_keywords_compiles_and_matches_loop(registered):
    spec = folnet.register_operator(**GOOD)
    registered.append("q")
    assert folnet.get_operator("bprod") is spec
    k, v = inputs(spec, seed=11)
    assert_close(compile_operator("q", "einsum")(k, v), loop_bprod(k, v), rtol=1e-12,
                 atol=1e-12, what="bprod against its loop")


@pytest.mark.numerics
def test_register_toml_table_and_use_everywhere(registered):
    spec = folnet.register_operator('''
        [operator]
        symbol = "r"
        name = "trans_first"
        typing = "B <- B x B"
        kernel = "a x h"
        premise = "a y h"
        output = "x y h"
        bdim = "h"
        rdim = "a"
        activation = "softmax"
        sizes = { h = "D2" }
    ''')
    registered.append("r")
    assert spec.symbol in {s.symbol for s in folnet.operators()}
    k, v = inputs(spec, seed=12)
    assert_close(compile_operator("r")(k, v), loop_trans_first(k, v), rtol=1e-12, atol=1e-12,
                 what="trans_first against its loop")
    # attention shaped: SDPA runs it and agrees
    k32, v32 = k.float(), v.float()
    assert_close(compile_operator("r", "sdpa")(k32, v32), compile_operator("r", "einsum")(k32, v32),
                 rtol=1e-5, atol=1e-5, what="trans_first on sdpa")


def test_register_refuses_duplicates_and_builtins(registered):
    folnet.register_operator(**GOOD)
    registered.append("q")
    with pytest.raises(folnet.FolnetError, match="pass replace=True"):
        folnet.register_operator(**{**GOOD, "name": "other"})
    replaced = folnet.register_operator(**{**GOOD, "name": "other"}, replace=True)
    assert folnet.get_operator("q") is replaced
    with pytest.raises(folnet.FolnetError, match="clashes with built-in operator 'j'"):
        folnet.register_operator(**{**GOOD, "symbol": "j"}, replace=True)
    with pytest.raises(folnet.FolnetError, match="built-in and cannot be unregistered"):
        folnet.unregister_operator("j")
    with pytest.raises(folnet.FolnetError, match="either a TOML table or keyword fields"):
        folnet.register_operator("[operator]", symbol="z")


def test_cli_ops_prints_table_2(capsys):
    assert cli_main(["ops"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["Sym", "Name", "Typing", "B-dim", "R-dim", "Formula",
                                           "Kernel", "act.", "Mask"]
    assert "u_h(x,y) = sum_a K_h(x,a) v_h(a,y)" in out and "kernel, premise" in out
    assert len([line for line in out.splitlines() if line[:1].isalpha()]) == 1 + 7
    assert cli_main(["ops", "--markdown"]) == 0
    assert capsys.readouterr().out.startswith("| Sym | Name |")
