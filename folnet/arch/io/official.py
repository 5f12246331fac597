"""Read checkpoints released with the FOLNet paper: ``NAME.cfg`` (JSON) + ``NAME.pt``.

The state dict is read with ``torch.load(weights_only=True)``, so no pickled code ever runs.
Every released key is mapped onto our fused layout (docs/design.md section 4: per-operator
Linears in the release, one fused projection per stream here); keys left over, keys missing and
shape mismatches are errors that name the keys. The model they load into is built above the
models, in `folnet.arch.convert` (`load_official`).
"""

from __future__ import annotations

import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from folnet.arch.config import SIZE_LIMITS, ModelConfig, check_fields
from folnet.arch.layer import DualStreamLayer
from folnet.errors import FolnetError
from folnet.ops.registry import get_operator
from folnet.read_files import read_json

_APE_KEYS = ("folnet.encoder.abs_pos_embd.weight", "folnet.encoder.pos_embd.weight")
_READERS = {"join", "mu", "assoc", "trans", "prod"}  # reader.1 (unary) / reader.2 (binary)


def read_official_config(path: str | Path) -> tuple[ModelConfig, dict[str, Any]]:
    """Translate a released ``.cfg`` into our `ModelConfig` (plus the raw JSON).

    Every field read is checked for type and range first (a string ``num_layers``, a short
    ``predicate_dims``, a list ``mixer_ops``): each fault is a `FolnetError` naming the file
    and the released field, never a TypeError or IndexError from the conversion."""
    path = Path(path)
    raw = read_json(path, what="released config")
    if not isinstance(raw, dict):
        raise FolnetError(f"{path}: expected a JSON object of config fields, got "
                          f"{type(raw).__name__}")
    fields = _ReleasedFields(raw, str(path))
    for key, want in (("hidden_act", "gelu"), ("boolean_type", "mlp")):
        if raw.get(key, want) != want:
            raise FolnetError(f"{path}: {key} = {raw[key]!r} is not supported (only {want!r})")
    if fields.flag("diag_link"):
        raise FolnetError(f"{path}: diag_link = true is not supported")
    # the released flags are independent: the absolute table is added to the unary atoms, the
    # relative embedding starts the binary stream (docs/design.md section 5)
    ape, rpe = fields.flag("absolute_position"), fields.flag("relative_position")
    pdims = fields.dims("predicate_dims", ("D1", "D2"))
    idims = fields.dims("intermediate_dims", ("F1", "F2"))
    values = dict(
        ops=fields.mixer_ops(), D1=pdims[0], D2=pdims[1], L=fields.size("num_layers", "L"),
        H=fields.size("num_heads", "H"), S=fields.size("head_size", "S"), F1=idims[0],
        F2=idims[1], delta=fields.size("max_position_offset", "delta"),
        position={(True, True): "ape+rpe", (True, False): "ape", (False, True): "rpe",
                  (False, False): "none"}[ape, rpe],
        vocab_size=fields.size("vocab_size", "vocab_size"),
        type_vocab_size=fields.size("type_vocab_size", "type_vocab_size", 2),
        dropout=fields.number("hidden_dropout_prob", 0.1),
        layer_norm_eps=fields.number("layer_norm_eps", 1e-12),
        initializer_range=fields.number("initializer_range", 0.02),
    )
    # the released names map onto ours one to one, so a range fault names the released one
    released = {"dropout": "hidden_dropout_prob", "layer_norm_eps": "layer_norm_eps",
                "initializer_range": "initializer_range"}
    for ours, theirs in released.items():
        try:
            check_fields({ours: values[ours]})
        except FolnetError as exc:
            raise FolnetError(f"{path}: field {theirs!r}: {exc}") from None
    return ModelConfig(**values), raw


_MISSING = object()


class _ReleasedFields:
    """Typed reads of a released ``.cfg``'s fields, each fault naming the file and field."""

    def __init__(self, raw: dict[str, Any], where: str):
        self.raw, self.where = raw, where

    def get(self, key: str, default: Any = _MISSING) -> Any:
        if key in self.raw:
            return self.raw[key]
        if default is _MISSING:
            raise FolnetError(f"{self.where}: missing field {key!r}")
        return default

    def fail(self, key: str, want: str, value: Any) -> FolnetError:
        return FolnetError(f"{self.where}: field {key!r} must be {want}, got {value!r}")

    def size(self, key: str, ours: str, default: Any = _MISSING) -> int:
        """A positive integer within our bound of the field it becomes (``SIZE_LIMITS``)."""
        value, limit = self.get(key, default), SIZE_LIMITS[ours]
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
            raise self.fail(key, f"an integer in [1, {limit}] (our {ours})", value)
        return value

    def number(self, key: str, default: float) -> float:
        value = self.get(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self.fail(key, "a number", value)
        return float(value)

    def flag(self, key: str) -> bool:
        value = self.get(key, False)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.fail(key, "true or false", value)
        return value

    def dims(self, key: str, ours: tuple[str, str]) -> tuple[int, int]:
        """The released ``[_, unary, binary]`` lists (entries 1 and 2 are used)."""
        value = self.get(key)
        if not isinstance(value, list) or len(value) < 3:
            raise self.fail(key, f"a list of 3 sizes [_, {ours[0]}, {ours[1]}]", value)
        picked = []
        for i, name in zip((1, 2), ours, strict=True):
            item, limit = value[i], SIZE_LIMITS[name]
            if not isinstance(item, int) or isinstance(item, bool) or not 1 <= item <= limit:
                raise self.fail(f"{key}[{i}]", f"an integer in [1, {limit}] (our {name})", item)
            picked.append(item)
        return picked[0], picked[1]

    def mixer_ops(self) -> str:
        """``{"1": [unary operator names], "2": [binary ones]}`` as our operator string."""
        mixer = self.get("mixer_ops")
        if not isinstance(mixer, dict):
            raise self.fail("mixer_ops", 'an object {"1": [names], "2": [names]}', mixer)
        parts = []
        for arity in ("1", "2"):
            names = mixer.get(arity) or []
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise self.fail(f"mixer_ops.{arity}", "a list of operator names", names)
            try:
                parts.append("".join(get_operator(n).symbol for n in names))
            except FolnetError as exc:
                raise FolnetError(f"{self.where}: field 'mixer_ops.{arity}': {exc}") from None
        return ".".join(parts)


class ReleasedWeights:
    """The released state dict with bookkeeping of which keys were used."""

    def __init__(self, sd: dict[str, torch.Tensor], where: str):
        self.sd, self.where, self.used = sd, where, set()

    def has(self, key: str) -> bool:
        return key in self.sd

    def take(self, key: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        if key not in self.sd:
            raise FolnetError(f"{self.where}: missing key {key!r}")
        value = self.sd[key]
        if shape is not None and tuple(value.shape) != tuple(shape):
            raise FolnetError(f"{self.where}: key {key!r} has shape {tuple(value.shape)}, "
                              f"expected {tuple(shape)}")
        self.used.add(key)
        return value


def _map_layer(src: ReleasedWeights, layer: DualStreamLayer, ours: str, theirs: str,
               out: dict) -> None:
    """Fill the fused parameters of one of our layers from one released layer."""
    params = {n: p.detach().clone() for n, p in layer.named_parameters()}
    bias_pos = {"U": 0, "B": 0}
    op_count = {"U": 0, "B": 0}
    order = {"U": 0, "B": 0}
    for slot in layer.slots:
        spec = slot.spec
        side = spec.typing.output
        group = f"{theirs}deducers.0.operators.{1 if side == 'U' else 2}.{order[side]}."
        order[side] += 1
        by_stream: dict[str, list] = {"U": [], "B": []}
        for seg in (slot.kernel, slot.premise):
            by_stream[seg.stream].append(seg)
        for stream, segs in by_stream.items():
            if not segs:
                continue
            if spec.name == "cjoin":
                name = "kernel" if stream == "U" else "premise"
            elif spec.name in _READERS:
                name = "reader.1" if stream == "U" else "reader.2"
            else:
                raise FolnetError(f"operator {spec.symbol!r} ({spec.name}) has no released-code "
                                  f"key layout; only built-in operators can be imported")
            proj = "proj_u" if stream == "U" else "proj_b"
            width = sum(s.width for s in segs)
            d_in = params[f"{proj}.weight"].shape[1]
            weight = src.take(f"{group}{name}.weight", (width, d_in))
            start = segs[0].start
            params[f"{proj}.weight"][start : start + width] = weight
            biased = [s.bias for s in segs]
            if any(biased) != all(biased):
                raise FolnetError(f"operator {spec.symbol!r}: mixed bias flags on one stream")
            if all(biased):
                b = src.take(f"{group}{name}.bias", (width,))
                params[f"{proj}.bias"][bias_pos[stream] : bias_pos[stream] + width] = b
                bias_pos[stream] += width
            elif src.has(f"{group}{name}.bias"):
                raise FolnetError(f"{src.where}: unexpected key {group}{name}.bias (the spec of "
                                  f"{spec.symbol!r} declares no bias)")
        name = "output" if spec.name == "cjoin" else "writer"
        outp = "out_u" if side == "U" else "out_b"
        d_out = params[f"{outp}.weight"].shape[0]
        params[f"{outp}.weight"][:, slot.out_start : slot.out_start + slot.out_width] = src.take(
            f"{group}{name}.weight", (d_out, slot.out_width))
        params[f"{outp}.bias"][op_count[side]] = src.take(f"{group}{name}.bias", (d_out,))
        op_count[side] += 1
    ffn = f"{theirs}deducers.1.operators."
    for ours_name, key in (("ffn_u.inp", "1.0.clause_in"), ("ffn_u.out", "1.0.clause_out"),
                           ("ffn_b.inp", "2.0.clause_in"), ("ffn_b.out", "2.0.clause_out"),
                           ("ffn_b.skip", "2.0.clause_skip")):
        for part in ("weight", "bias"):
            params[f"{ours_name}.{part}"] = src.take(f"{ffn}{key}.{part}",
                                                     tuple(params[f"{ours_name}.{part}"].shape))
    out.update({f"{ours}{n}": p for n, p in params.items()})


def released_state(model: nn.Module, src: ReleasedWeights, head: str | None,
                    weights: Path) -> dict[str, torch.Tensor]:
    """Our state dict for ``model`` from the released one: every key mapped, every shape
    checked against the model's (which may be on the meta device: then only the checks run)."""
    ours: dict[str, torch.Tensor] = {}
    shape = {n: tuple(p.shape) for n, p in model.state_dict().items()}
    e = "encoder."
    ours[f"{e}atoms.word.weight"] = src.take("folnet.encoder.word_embd.weight",
                                             shape[f"{e}atoms.word.weight"])
    ours[f"{e}atoms.token_type.weight"] = src.take("folnet.encoder.type_embd.weight",
                                                   shape[f"{e}atoms.token_type.weight"])
    if model.cfg.relative_atoms:
        ours[f"{e}atoms.relative.weight"] = src.take("folnet.encoder.rel_pos_embd.weight",
                                                     shape[f"{e}atoms.relative.weight"])
    if model.cfg.absolute_positions:
        key = next((k for k in _APE_KEYS if src.has(k)), _APE_KEYS[0])
        ours[f"{e}atoms.absolute.weight"] = src.take(key, shape[f"{e}atoms.absolute.weight"])
    for i, layer in enumerate(model.encoder.layers):
        _map_layer(src, layer, f"{e}layers.{i}.", f"folnet.reasoner.layers.{i}.", ours)
    for part in ("weight", "bias"):
        ours[f"{e}pooler.{part}"] = src.take(f"folnet.dense.{part}", shape[f"{e}pooler.{part}"])
    if head in ("pretraining", "mlm"):
        ours["mlm.bias"] = src.take("cls.heads.predictions.bias", shape["mlm.bias"])
        for part in ("weight", "bias"):
            ours[f"mlm.transform.{part}"] = src.take(
                f"cls.heads.predictions.transform.dense.{part}", shape[f"mlm.transform.{part}"])
        if src.has("cls.heads.predictions.decoder.weight"):
            dec = src.take("cls.heads.predictions.decoder.weight")
            if not torch.equal(dec, ours[f"{e}atoms.word.weight"]):
                raise FolnetError(f"{weights}: cls.heads.predictions.decoder.weight differs from "
                                  f"the word embedding; folnet ties them")
    if head == "pretraining":
        for part in ("weight", "bias"):
            ours[f"nsp.{part}"] = src.take(f"cls.heads.seq_relationship.{part}",
                                           shape[f"nsp.{part}"])
    if head == "classification":
        for part in ("weight", "bias"):
            ours[f"classifier.linear.{part}"] = src.take(f"classifier.{part}",
                                                         shape[f"classifier.linear.{part}"])
    head_keys = ("cls.", "classifier.")
    left = sorted(k for k in src.sd if k not in src.used
                  and not (head is None and k.startswith(head_keys)))
    if left:
        raise FolnetError(f"{weights}: unknown or unused key(s) {left[:8]}"
                          f"{' ...' if len(left) > 8 else ''} for a {model.cfg.ops} model with "
                          f"head {head!r}")
    missing = sorted(set(shape) - set(ours))
    if missing:
        raise FolnetError(f"{weights}: no released key for parameter(s) {missing[:8]}")
    return ours


def _load_weights(weights: Path) -> Any:
    """``torch.load(weights_only=True)`` of a released ``.pt``; a file that is not a tensor
    pickle (an arbitrary object, a dict of other things, random bytes, a truncated download, a
    zip of something else) is one line naming it and what is expected. Why reworded: torch's
    refusal is a paragraph that advises loading with ``weights_only=False``, which would run
    whatever code the pickle holds, and a damaged archive is a message from its C++ reader;
    only the reason is kept. Torch's warning about the pickle protocol of such a file is
    silenced."""
    reason = _container_fault(weights)
    if reason is None:
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Detected pickle protocol")
                return torch.load(weights, map_location="cpu", weights_only=True)
        except Exception as exc:
            # a KeyError or EOFError from the unpickler says nothing a user can act on
            text = "" if isinstance(exc, (KeyError, IndexError, EOFError)) else str(exc)
            text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # torch colours its advice
            text = " ".join(text.split("WeightsUnpickler error:", 1)[-1].split())
            text = text.split(" Check the documentation of torch.load")[0]  # a pointer to docs
            reason = text.split(". ")[0].rstrip(".")[:200] or "not a file torch.save writes"
    raise FolnetError(f"{weights}: not a state dict that convert can read ({reason}); "
                      f"expected a torch.save of a dict of parameter names to tensors, read "
                      f"without running pickled code (weights_only=True)") from None


def _container_fault(weights: Path) -> str | None:
    """What is wrong with `weights` as a file torch.save writes (a zip archive holding
    ``NAME/data.pkl``), found before torch reads it; None when it looks like one, or like
    the older plain pickle format, which torch then reads (and refuses) itself."""
    try:
        with open(weights, "rb") as handle:
            head = handle.read(4)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if not head:
        return "an empty file"
    if head != b"PK\x03\x04":  # not a zip: a plain pickle, or bytes torch refuses itself
        return None
    if not zipfile.is_zipfile(weights):
        return ("a truncated zip archive: its end, the directory of its members, is missing; "
                "an incomplete download or copy?")
    try:
        with zipfile.ZipFile(weights) as archive:
            names = archive.namelist()
            if not any(name.count("/") == 1 and name.endswith("/data.pkl") for name in names):
                shown = ", ".join(repr(n) for n in names[:4]) + (" ..." if len(names) > 4 else "")
                return (f"a zip archive that torch.save did not write: no NAME/data.pkl among "
                        f"its {len(names)} member(s) {shown}")
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        return f"a corrupt zip archive: {exc}"
    if bad is not None:
        return f"a corrupt zip archive: member {bad!r} fails its CRC check"
    return None


def read_released(prefix: str | Path, head: str | None, backend: str
                  ) -> tuple[ModelConfig, ReleasedWeights, str | None, int]:
    """``prefix.cfg`` and ``prefix.pt`` read and checked: the config (with ``backend``), the
    weights, the head (``"auto"``: the one the weights carry) and the number of labels."""
    prefix = str(prefix)
    cfg, _raw = read_official_config(prefix + ".cfg")
    cfg = cfg.replace(backend=backend)
    weights = Path(prefix + ".pt")
    if not weights.is_file():
        fault = "are not a file" if weights.exists() else "do not exist"
        raise FolnetError(f"released weights {str(weights)!r} {fault}")
    sd = _load_weights(weights)
    if isinstance(sd, dict) and "model" in sd and isinstance(sd["model"], dict):
        sd = sd["model"]
    if not isinstance(sd, dict):
        raise FolnetError(f"{weights}: expected a state dict, got {type(sd).__name__}")
    odd = [f"{k!r} ({type(v).__name__})" for k, v in sd.items()
           if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if odd:
        raise FolnetError(f"{weights}: expected a state dict of parameter names to tensors; "
                          f"entries {', '.join(odd[:8])}{' ...' if len(odd) > 8 else ''} are "
                          f"not named tensors")
    src = ReleasedWeights(sd, str(weights))
    rows = src.sd.get("folnet.encoder.word_embd.weight")
    if rows is not None and rows.shape[0] != cfg.padded_vocab:
        raise FolnetError(f"{weights}: word embedding has {rows.shape[0]} rows but vocab_size "
                          f"{cfg.vocab_size} pads to {cfg.padded_vocab}")
    has_mlm = src.has("cls.heads.predictions.bias")
    has_nsp = src.has("cls.heads.seq_relationship.weight")
    has_cls = src.has("classifier.weight")
    if head == "auto":
        head = ("pretraining" if has_mlm and has_nsp else "mlm" if has_mlm
                else "classification" if has_cls else None)
    if has_cls and sd["classifier.weight"].ndim != 2:
        raise FolnetError(f"{weights}: classifier.weight has shape "
                          f"{tuple(sd['classifier.weight'].shape)}, expected (num_labels, D1)")
    num_labels = int(sd["classifier.weight"].shape[0]) if has_cls else 2
    return cfg, src, head, num_labels
