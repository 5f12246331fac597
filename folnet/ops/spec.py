"""Operator specs: a neural logic operator declared as data, parsed and validated once.

Key to the index letters (paper Table 2):

    x, y   output tokens            a   the reduction token
    h      head channel             s   per-head channel        w   reduced channel

A spec names the index lists of the kernel K, the premise v and the output u over these letters.
Token letters say which stream positions a tensor is indexed by (one for the unary stream, two --
row then column -- for the binary stream); channel letters say how the projected channels are
viewed. The typing ``OUT <- KERNEL x PREMISE`` fixes which stream each of them comes from.
Everything here is plain data: parsing a spec never touches torch.

`parse_spec` is a row of small checkers, one per rule, in a fixed order (the first fault found
is the one reported); a checker raises `_Fault` with the field it is about, and `parse_spec`
adds the operator's name. The fields a spec table may hold, and their defaults, are those of
the `OperatorSpec` dataclass.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields

from folnet.errors import FolnetError, choices
from folnet.ops.sizes import channel_sizes, check_expression, evaluate_scale

TOKEN_LETTERS = ("x", "y", "a")
CHANNEL_LETTERS = ("h", "s", "w")
LETTERS = TOKEN_LETTERS + CHANNEL_LETTERS
#: An operator's two inputs, projected from the streams, in the order every layout stores them
#: (kernel before premise); the only tensors a causal ``mask`` may name.
ROLES = ("kernel", "premise")
#: Every tensor a spec gives an index list: the two inputs and the output.
TENSORS = (*ROLES, "output")
ACTIVATIONS = ("identity", "softmax")
REALISATIONS = ("einsum", "ffn")
ARITY = {"U": 1, "B": 2}
DEFAULT_SIZES = {"h": "H", "s": "S", "w": "S"}

_TYPING_RE = re.compile(r"^\s*([UB])\s*(?:<-|←)\s*([UB])\s*[x×*]\s*([UB])\s*$")


class _Fault(Exception):
    """A broken rule: the field it is about and what was expected (`parse_spec` names the
    operator in front)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name
        self.message = message


@dataclass(frozen=True)
class Typing:
    """``OUT <- KERNEL x PREMISE`` with U (unary, arity 1) or B (binary, arity 2) on each side."""

    output: str
    kernel: str
    premise: str

    def side(self, tensor: str) -> str:
        """The stream (``'U'`` or ``'B'``) of ``'kernel'``, ``'premise'`` or ``'output'``."""
        if tensor not in TENSORS:
            raise KeyError(tensor)
        return getattr(self, tensor)

    def __str__(self) -> str:
        return f"{self.output} <- {self.kernel} x {self.premise}"


def _typing(text: object) -> Typing:
    if not isinstance(text, str):
        raise _Fault("typing", f"expected a string like 'U <- B x U', got {text!r}")
    match = _TYPING_RE.match(text)
    if match is None:
        raise _Fault("typing",
                     f"cannot parse {text!r}; expected 'OUT <- KERNEL x PREMISE' with each of "
                     "OUT, KERNEL, PREMISE one of 'U' (unary) or 'B' (binary), e.g. 'U <- B x U'")
    return Typing(*match.groups())


def parse_typing(text: str, *, where: str = "typing") -> Typing:
    """Parse ``"U <- B x U"`` (also ``U<-BxU`` and ``U ← B × U``)."""
    try:
        return _typing(text)
    except _Fault as fault:
        raise FolnetError(f"{where}: {fault.message}") from None


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
        return self.typing.side(role)

    def projection(self, role: str) -> Projection:
        """How the ``'kernel'`` or the ``'premise'`` is projected from its stream."""
        return {"kernel": self.kernel_proj, "premise": self.premise_proj}[role]

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


# -- parsing and validation: one checker per rule ----------------------------------------------

#: The fields a spec table may hold, those it must hold, and the defaults of the others: all
#: read from `OperatorSpec`.
FIELDS = tuple(f.name for f in fields(OperatorSpec))
REQUIRED = tuple(f.name for f in fields(OperatorSpec)
                 if f.default is MISSING and f.default_factory is MISSING)
_DEFAULTS = {f.name: f.default if f.default_factory is MISSING else f.default_factory()
             for f in fields(OperatorSpec) if f.name not in REQUIRED}


def _label(data: Mapping[str, object]) -> str:
    """How messages name the operator: ``operator 'j' (join)``, as far as ``data`` says."""
    label = f"operator {data.get('symbol', '?')!r}"
    return label + f" ({data['name']})" if "name" in data else label


def _check_fields(data: Mapping[str, object], label: str) -> None:
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise FolnetError(f"{label}: unknown field(s) {unknown}; known fields: {sorted(FIELDS)}")
    for key in REQUIRED:
        if key not in data:
            raise FolnetError(f"{label}: missing required field {key!r}")


def _symbol(value: object) -> str:
    if not (isinstance(value, str) and len(value) == 1 and value.isalpha() and value.islower()):
        raise _Fault("symbol", f"expected one lowercase letter, got {value!r}")
    return value


def _name(value: object) -> str:
    if not (isinstance(value, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value)):
        raise _Fault("name", f"expected an identifier, got {value!r}")
    return value


def _index_list(tensor: str, value: object) -> tuple[str, ...]:
    """``'x a h'``, ``'xah'``, ``'x,a,h'`` or a sequence of letters, as a tuple of letters."""
    if isinstance(value, str):
        text = value.replace(",", " ")
        parts = text.split() if " " in text.strip() else list(text.strip())
    elif isinstance(value, Iterable):
        parts = list(value)
    else:
        raise _Fault(tensor, f"expected an index list like 'x a h', got {value!r}")
    if not all(isinstance(p, str) and len(p) == 1 for p in parts):
        raise _Fault(tensor, f"expected single index letters, got {value!r}")
    return tuple(parts)


def _check_index_list(tensor: str, idx: tuple[str, ...], typing: Typing) -> None:
    """Known letters, none twice, and as many token letters as the typing's side has."""
    bad = [c for c in idx if c not in LETTERS]
    if bad:
        raise _Fault(tensor, f"unknown index letter(s) {bad}; use tokens "
                             f"{choices(TOKEN_LETTERS)} and channels {choices(CHANNEL_LETTERS)}")
    if len(set(idx)) != len(idx):
        raise _Fault(tensor, f"index list {' '.join(idx)!r} repeats a letter")
    side = typing.side(tensor)
    ntok = sum(c in TOKEN_LETTERS for c in idx)
    if ntok != ARITY[side]:
        raise _Fault(tensor, f"typing {typing} makes the {tensor} "
                             f"{'unary' if side == 'U' else 'binary'} ({ARITY[side]} token "
                             f"index), but {' '.join(idx)!r} has {ntok}")


def _letter(key: str, value: object) -> str:
    if not (isinstance(value, str) and value in LETTERS):
        raise _Fault(key, f"expected one index letter of {choices(LETTERS)}, got {value!r}")
    return value


def _check_dims(lists: Mapping[str, tuple[str, ...]], rdim: str, bdim: str) -> None:
    """The R-dim is in both inputs and not in the output; the B-dim is in all three."""
    kernel, premise, output = (" ".join(lists[t]) for t in TENSORS)
    if rdim not in lists["kernel"] or rdim not in lists["premise"] or rdim in lists["output"]:
        raise _Fault("rdim", f"{rdim!r} must appear in the kernel ({kernel!r}) and the premise "
                             f"({premise!r}) and not in the output ({output!r})")
    if not all(bdim in lists[t] for t in TENSORS):
        raise _Fault("bdim", f"{bdim!r} must appear in the kernel ({kernel!r}), the premise "
                             f"({premise!r}) and the output ({output!r})")


def _check_reduction(lists: Mapping[str, tuple[str, ...]], rdim: str) -> None:
    """Every output letter comes from an input, and the R-dim is the only letter summed out."""
    inputs = set(lists["kernel"]) | set(lists["premise"])
    missing = [c for c in lists["output"] if c not in inputs]
    if missing:
        raise _Fault("output", f"index letter(s) {missing} appear in no input; every output "
                               "index must come from the kernel or the premise")
    stray = sorted(c for c in inputs if c not in lists["output"] and c != rdim)
    if stray:
        raise _Fault("rdim", f"letter(s) {stray} are summed out but are not the R-dim {rdim!r}; "
                             "an operator reduces over exactly one index")


def _one_of(key: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise _Fault(key, f"expected {choices(allowed)}, got {value!r}")
    return value  # type: ignore[return-value]


def _mask(value: object, typing: Typing, lists: Mapping[str, tuple[str, ...]]
          ) -> tuple[str, ...]:
    """The inputs a causal model masks: binary ones of `ROLES`, each once."""
    if isinstance(value, str):
        value = (value,) if value else ()
    mask = tuple(value)  # type: ignore[arg-type]
    for role in mask:
        if role not in ROLES:
            raise _Fault("mask", f"expected a list of {choices(ROLES)}, got {role!r}")
        if ARITY[typing.side(role)] != 2:
            raise _Fault("mask", f"a causal mask applies to binary tensors only; the {role} "
                                 f"({' '.join(lists[role])!r}) is unary")
    if len(set(mask)) != len(mask):
        raise _Fault("mask", f"repeated entry in {list(mask)}")
    return mask


def _sizes(value: object, lists: Mapping[str, tuple[str, ...]]) -> tuple[tuple[str, str], ...]:
    """Each channel letter used, with its size expression (given, else `DEFAULT_SIZES`)."""
    given = value or {}
    if not isinstance(given, Mapping):
        raise _Fault("sizes", f"expected a table letter -> size expression, got {given!r}")
    for letter, expr in given.items():
        if letter not in CHANNEL_LETTERS:
            raise _Fault("sizes", f"{letter!r} is not a channel letter; use "
                                  f"{choices(CHANNEL_LETTERS)}")
        try:
            check_expression(str(expr))
        except FolnetError as exc:
            raise _Fault("sizes", f"{letter}: {exc}") from None
    used = {c for t in TENSORS for c in lists[t]}
    return tuple((c, str(given.get(c, DEFAULT_SIZES[c]))) for c in CHANNEL_LETTERS if c in used)


def _flag(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _Fault(key, f"expected true or false, got {value!r}")
    return value


def _text(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise _Fault(key, f"expected a string, got {value!r}")
    return value


def _projection(key: str, value: object) -> Projection:
    """A ``{bias, scale}`` table (missing: `Projection`'s defaults)."""
    if value is None:
        return Projection()
    if isinstance(value, Projection):
        return value
    if not isinstance(value, Mapping):
        raise _Fault(key, f"expected a table with 'bias' and 'scale', got {value!r}")
    unknown = set(value) - {"bias", "scale"}
    if unknown:
        raise _Fault(key, f"unknown key(s) {sorted(unknown)}; expected "
                          f"{choices(['bias', 'scale'])}")
    bias = value.get("bias", True)
    if not isinstance(bias, bool):
        raise _Fault(key, f"'bias' must be true or false, got {bias!r}")
    scale = str(value.get("scale", "1"))
    try:
        check_expression(scale)
    except FolnetError as exc:
        raise _Fault(key, f"'scale': {exc}") from None
    return Projection(bias=bias, scale=scale)


def parse_spec(data: Mapping[str, object]) -> OperatorSpec:
    """Validate a mapping of spec fields (a TOML table or keyword arguments) into a spec.

    Every problem is a `FolnetError` naming the operator, the field and what was expected.
    """
    if not isinstance(data, Mapping):
        raise FolnetError(f"an operator spec must be a table of fields, got {type(data).__name__}")
    label = _label(data)
    _check_fields(data, label)
    given = {**_DEFAULTS, **data}
    try:
        symbol, name = _symbol(given["symbol"]), _name(given["name"])
        typing = _typing(given["typing"])
        lists = {t: _index_list(t, given[t]) for t in TENSORS}
        for t in TENSORS:
            _check_index_list(t, lists[t], typing)
        rdim, bdim = _letter("rdim", given["rdim"]), _letter("bdim", given["bdim"])
        _check_dims(lists, rdim, bdim)
        _check_reduction(lists, rdim)
        return OperatorSpec(
            symbol=symbol, name=name, typing=typing, **lists, bdim=bdim, rdim=rdim,
            activation=_one_of("activation", given["activation"], ACTIVATIONS),
            mask=_mask(given["mask"], typing, lists), sizes=_sizes(given["sizes"], lists),
            realisation=_one_of("realisation", given["realisation"], REALISATIONS),
            kernel_dropout=_flag("kernel_dropout", given["kernel_dropout"]),
            remark=_text("remark", given["remark"]),
            kernel_proj=_projection("kernel_proj", given["kernel_proj"]),
            premise_proj=_projection("premise_proj", given["premise_proj"]))
    except _Fault as fault:
        raise FolnetError(f"{label}: field {fault.field!r}: {fault.message}") from None


def spec_to_dict(spec: OperatorSpec) -> dict[str, object]:
    """The inverse of `parse_spec`: plain data that a checkpoint can carry (one entry per field
    of `OperatorSpec`, in its order)."""
    data: dict[str, object] = {f.name: getattr(spec, f.name) for f in fields(OperatorSpec)}
    data.update({t: " ".join(spec.tensor(t)) for t in TENSORS})
    data.update({f"{r}_proj": {"bias": spec.projection(r).bias, "scale": spec.projection(r).scale}
                 for r in ROLES})
    data.update(typing=str(spec.typing), mask=list(spec.mask), sizes=dict(spec.sizes))
    return data


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
    for role in ROLES:
        evaluate_scale(spec.projection(role).scale, dims,
                       what=f"{label}: field '{role}_proj': 'scale'")
    return sizes
