"""Operator specs: a neural logic operator declared as data, parsed and validated once.

Key to the index letters (paper Table 2):

    x, y   output tokens            a   the reduction token
    h      head channel             s   per-head channel        w   reduced channel

A spec names the index lists of the kernel K, the premise v and the output u over these letters.
Token letters say which stream positions a tensor is indexed by (one for the unary stream, two --
row then column -- for the binary stream); channel letters say how the projected channels are
viewed. The typing ``OUT <- KERNEL x PREMISE`` fixes which stream each of them comes from.
Everything here is plain data: parsing a spec never touches torch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from folnet.errors import FolnetError, choices
from folnet.ops.sizes import channel_sizes, check_expression, evaluate_scale

TOKEN_LETTERS = ("x", "y", "a")
CHANNEL_LETTERS = ("h", "s", "w")
LETTERS = TOKEN_LETTERS + CHANNEL_LETTERS
ACTIVATIONS = ("identity", "softmax")
MASKABLE = ("kernel", "premise")
REALISATIONS = ("einsum", "ffn")
ARITY = {"U": 1, "B": 2}
DEFAULT_SIZES = {"h": "H", "s": "S", "w": "S"}

_TYPING_RE = re.compile(r"^\s*([UB])\s*(?:<-|←)\s*([UB])\s*[x×*]\s*([UB])\s*$")


@dataclass(frozen=True)
class Typing:
    """``OUT <- KERNEL x PREMISE`` with U (unary, arity 1) or B (binary, arity 2) on each side."""

    output: str
    kernel: str
    premise: str

    def __str__(self) -> str:
        return f"{self.output} <- {self.kernel} x {self.premise}"


def parse_typing(text: str, *, where: str = "typing") -> Typing:
    """Parse ``"U <- B x U"`` (also ``U<-BxU`` and ``U ← B × U``)."""
    if not isinstance(text, str):
        raise FolnetError(f"{where}: expected a string like 'U <- B x U', got {text!r}")
    match = _TYPING_RE.match(text)
    if match is None:
        raise FolnetError(
            f"{where}: cannot parse {text!r}; expected 'OUT <- KERNEL x PREMISE' with each of "
            "OUT, KERNEL, PREMISE one of 'U' (unary) or 'B' (binary), e.g. 'U <- B x U'"
        )
    return Typing(*match.groups())


@dataclass(frozen=True)
class Projection:
    """How a kernel or premise is projected from its stream: bias and a constant scale."""

    bias: bool = True
    scale: str = "1"


@dataclass(frozen=True)
class OperatorSpec:
    """A validated neural logic operator. Build it with `parse_spec`, never by hand."""

    symbol: str
    name: str
    typing: Typing
    kernel: tuple[str, ...]
    premise: tuple[str, ...]
    output: tuple[str, ...]
    bdim: str
    rdim: str
    activation: str = "identity"
    mask: tuple[str, ...] = ()
    sizes: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    kernel_proj: Projection = Projection()
    premise_proj: Projection = Projection()
    realisation: str = "einsum"
    kernel_dropout: bool = False
    remark: str = ""

    # -- derived views -------------------------------------------------------------------------
    def size_expr(self, letter: str) -> str:
        """The size expression of a channel letter (``'H'``, ``'S'``, ``'D2'`` ...)."""
        return dict(self.sizes)[letter]

    def tensor(self, role: str) -> tuple[str, ...]:
        """Index list of ``'kernel'``, ``'premise'`` or ``'output'``."""
        return {"kernel": self.kernel, "premise": self.premise, "output": self.output}[role]

    def stream(self, role: str) -> str:
        """Which stream (``'U'`` or ``'B'``) a kernel, premise or output lives on."""
        return {
            "kernel": self.typing.kernel,
            "premise": self.typing.premise,
            "output": self.typing.output,
        }[role]

    def tokens(self, role: str) -> tuple[str, ...]:
        return tuple(c for c in self.tensor(role) if c in TOKEN_LETTERS)

    def channels(self, role: str) -> tuple[str, ...]:
        return tuple(c for c in self.tensor(role) if c in CHANNEL_LETTERS)

    @property
    def equation(self) -> str:
        """The einsum equation over batch-first tensors, e.g. ``'bxah,bahs->bxhs'``."""
        k, p, o = ("".join(t) for t in (self.kernel, self.premise, self.output))
        return f"b{k},b{p}->b{o}"

    @property
    def formula(self) -> str:
        """The operator in the paper's notation, e.g. ``u_hs(x) = sum_a K_h(x,a) v_hs(a)``."""

        def atom(name: str, idx: tuple[str, ...]) -> str:
            ch = "".join(c for c in idx if c in CHANNEL_LETTERS)
            tok = ",".join(c for c in idx if c in TOKEN_LETTERS)
            return f"{name}{'_' + ch if ch else ''}({tok})"

        return (
            f"{atom('u', self.output)} = sum_{self.rdim} "
            f"{atom('K', self.kernel)} {atom('v', self.premise)}"
        )

    def __str__(self) -> str:
        return f"{self.symbol} ({self.name}): {self.typing}, {self.formula}"


# -- parsing and validation --------------------------------------------------------------------

_FIELDS = {
    "symbol", "name", "typing", "kernel", "premise", "output", "bdim", "rdim", "activation",
    "mask", "sizes", "kernel_proj", "premise_proj", "realisation", "kernel_dropout", "remark",
}
_REQUIRED = ("symbol", "name", "typing", "kernel", "premise", "output", "bdim", "rdim")


def _letters(value: object, *, fail) -> tuple[str, ...]:
    if isinstance(value, str):
        text = value.replace(",", " ")
        parts = text.split() if " " in text.strip() else list(text.strip())
    elif isinstance(value, Iterable):
        parts = list(value)
    else:
        fail(f"expected an index list like 'x a h', got {value!r}")
    if not all(isinstance(p, str) and len(p) == 1 for p in parts):
        fail(f"expected single index letters, got {value!r}")
    return tuple(parts)


def _projection(value: object, *, fail) -> Projection:
    if value is None:
        return Projection()
    if isinstance(value, Projection):
        return value
    if not isinstance(value, Mapping):
        fail(f"expected a table with 'bias' and 'scale', got {value!r}")
    unknown = set(value) - {"bias", "scale"}
    if unknown:
        fail(f"unknown key(s) {sorted(unknown)}; expected {choices(['bias', 'scale'])}")
    bias = value.get("bias", True)
    if not isinstance(bias, bool):
        fail(f"'bias' must be true or false, got {bias!r}")
    scale = str(value.get("scale", "1"))
    try:
        check_expression(scale)
    except FolnetError as exc:
        fail(f"'scale': {exc}")
    return Projection(bias=bias, scale=scale)


def parse_spec(data: Mapping[str, object]) -> OperatorSpec:
    """Validate a mapping of spec fields (a TOML table or keyword arguments) into a spec.

    Every problem is a `FolnetError` naming the operator, the field and what was expected.
    """
    if not isinstance(data, Mapping):
        raise FolnetError(f"an operator spec must be a table of fields, got {type(data).__name__}")
    label = f"operator {data.get('symbol', '?')!r}"
    if "name" in data:
        label += f" ({data['name']})"

    def fail(field_name: str):
        def raise_(message: str):
            raise FolnetError(f"{label}: field {field_name!r}: {message}")

        return raise_

    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise FolnetError(f"{label}: unknown field(s) {unknown}; known fields: {sorted(_FIELDS)}")
    for key in _REQUIRED:
        if key not in data:
            raise FolnetError(f"{label}: missing required field {key!r}")

    symbol = data["symbol"]
    if not (isinstance(symbol, str) and len(symbol) == 1 and symbol.isalpha() and symbol.islower()):
        fail("symbol")(f"expected one lowercase letter, got {symbol!r}")
    name = data["name"]
    if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)):
        fail("name")(f"expected an identifier, got {name!r}")
    typing = parse_typing(data["typing"], where=f"{label}: field 'typing'")

    roles = ("kernel", "premise", "output")
    lists = {role: _letters(data[role], fail=fail(role)) for role in roles}
    for role, idx in lists.items():
        bad = [c for c in idx if c not in LETTERS]
        if bad:
            fail(role)(f"unknown index letter(s) {bad}; use tokens {choices(TOKEN_LETTERS)} "
                       f"and channels {choices(CHANNEL_LETTERS)}")
        if len(set(idx)) != len(idx):
            fail(role)(f"index list {' '.join(idx)!r} repeats a letter")
        side = {"kernel": typing.kernel, "premise": typing.premise, "output": typing.output}[role]
        ntok = sum(c in TOKEN_LETTERS for c in idx)
        if ntok != ARITY[side]:
            fail(role)(f"typing {typing} makes the {role} {'unary' if side == 'U' else 'binary'}"
                       f" ({ARITY[side]} token index), but {' '.join(idx)!r} has {ntok}")
    kernel, premise, output = lists["kernel"], lists["premise"], lists["output"]

    rdim, bdim = data["rdim"], data["bdim"]
    for key, letter in (("rdim", rdim), ("bdim", bdim)):
        if not (isinstance(letter, str) and letter in LETTERS):
            fail(key)(f"expected one index letter of {choices(LETTERS)}, got {letter!r}")
    if rdim not in kernel or rdim not in premise or rdim in output:
        fail("rdim")(f"{rdim!r} must appear in the kernel ({' '.join(kernel)!r}) and the premise "
                     f"({' '.join(premise)!r}) and not in the output ({' '.join(output)!r})")
    if bdim not in kernel or bdim not in premise or bdim not in output:
        fail("bdim")(f"{bdim!r} must appear in the kernel ({' '.join(kernel)!r}), the premise "
                     f"({' '.join(premise)!r}) and the output ({' '.join(output)!r})")
    inputs = set(kernel) | set(premise)
    missing = [c for c in output if c not in inputs]
    if missing:
        fail("output")(f"index letter(s) {missing} appear in no input; every output index must "
                       "come from the kernel or the premise")
    stray = sorted(c for c in inputs if c not in output and c != rdim)
    if stray:
        fail("rdim")(f"letter(s) {stray} are summed out but are not the R-dim {rdim!r}; an "
                     "operator reduces over exactly one index")

    activation = data.get("activation", "identity")
    if activation not in ACTIVATIONS:
        fail("activation")(f"expected {choices(ACTIVATIONS)}, got {activation!r}")

    mask = data.get("mask", ())
    if isinstance(mask, str):
        mask = (mask,) if mask else ()
    mask = tuple(mask)
    for role in mask:
        if role not in MASKABLE:
            fail("mask")(f"expected a list of {choices(MASKABLE)}, got {role!r}")
        if ARITY[typing.kernel if role == "kernel" else typing.premise] != 2:
            fail("mask")(f"a causal mask applies to binary tensors only; the {role} "
                         f"({' '.join(lists[role])!r}) is unary")
    if len(set(mask)) != len(mask):
        fail("mask")(f"repeated entry in {list(mask)}")

    sizes_in = data.get("sizes", {}) or {}
    if not isinstance(sizes_in, Mapping):
        fail("sizes")(f"expected a table letter -> size expression, got {sizes_in!r}")
    for letter, expr in sizes_in.items():
        if letter not in CHANNEL_LETTERS:
            fail("sizes")(f"{letter!r} is not a channel letter; use {choices(CHANNEL_LETTERS)}")
        try:
            check_expression(str(expr))
        except FolnetError as exc:
            fail("sizes")(f"{letter}: {exc}")
    used = [c for c in CHANNEL_LETTERS if c in set(kernel) | set(premise) | set(output)]
    sizes = tuple((c, str(sizes_in.get(c, DEFAULT_SIZES[c]))) for c in used)

    realisation = data.get("realisation", "einsum")
    if realisation not in REALISATIONS:
        fail("realisation")(f"expected {choices(REALISATIONS)}, got {realisation!r}")
    kernel_dropout = data.get("kernel_dropout", False)
    if not isinstance(kernel_dropout, bool):
        fail("kernel_dropout")(f"expected true or false, got {kernel_dropout!r}")
    remark = data.get("remark", "")
    if not isinstance(remark, str):
        fail("remark")(f"expected a string, got {remark!r}")

    return OperatorSpec(
        symbol=symbol,
        name=name,
        typing=typing,
        kernel=kernel,
        premise=premise,
        output=output,
        bdim=bdim,
        rdim=rdim,
        activation=activation,
        mask=mask,
        sizes=sizes,
        kernel_proj=_projection(data.get("kernel_proj"), fail=fail("kernel_proj")),
        premise_proj=_projection(data.get("premise_proj"), fail=fail("premise_proj")),
        realisation=realisation,
        kernel_dropout=kernel_dropout,
        remark=remark,
    )


def spec_to_dict(spec: OperatorSpec) -> dict[str, object]:
    """The inverse of `parse_spec`: plain data that a checkpoint can carry."""
    return {
        "symbol": spec.symbol,
        "name": spec.name,
        "typing": str(spec.typing),
        "kernel": " ".join(spec.kernel),
        "premise": " ".join(spec.premise),
        "output": " ".join(spec.output),
        "bdim": spec.bdim,
        "rdim": spec.rdim,
        "activation": spec.activation,
        "mask": list(spec.mask),
        "sizes": dict(spec.sizes),
        "kernel_proj": {"bias": spec.kernel_proj.bias, "scale": spec.kernel_proj.scale},
        "premise_proj": {"bias": spec.premise_proj.bias, "scale": spec.premise_proj.scale},
        "realisation": spec.realisation,
        "kernel_dropout": spec.kernel_dropout,
        "remark": spec.remark,
    }


def check_sizes(spec: OperatorSpec, dims: Mapping[str, int]) -> dict[str, int]:
    """Evaluate every size and scale expression of ``spec`` for a model's dimensions ``dims``
    and return the channel sizes.

    `parse_spec` checks what an expression may say; only the model's dimensions tell what it
    is worth. A config.json carries both, so a loader calls this before anything is built: a
    width of zero, of 2**62 or of ``D2/3`` is then a `FolnetError` naming the operator, the
    field and the expression, never a crash inside torch (`folnet.ops.sizes` says the bounds).
    """
    label = f"operator {spec.symbol!r} ({spec.name})"
    sizes = channel_sizes(spec.sizes, dims, symbol=spec.symbol, label=label)
    for role in ("kernel_proj", "premise_proj"):
        proj = spec.kernel_proj if role == "kernel_proj" else spec.premise_proj
        evaluate_scale(proj.scale, dims, what=f"{label}: field {role!r}: 'scale'")
    return sizes
