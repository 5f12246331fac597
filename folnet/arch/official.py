"""Import checkpoints released with the FOLNet paper: ``NAME.cfg`` (JSON) + ``NAME.pt``.

The state dict is read with ``torch.load(weights_only=True)``, so no pickled code ever runs.
Every released key is mapped onto our fused layout (DESIGN.md section 4: per-operator Linears in
the release, one fused projection per stream here); keys left over, keys missing and shape
mismatches are errors that name the keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from folnet.arch.config import ModelConfig
from folnet.arch.layer import DualStreamLayer
from folnet.arch.models.encoder import FolnetModel
from folnet.errors import FolnetError
from folnet.files import read_json
from folnet.ops.registry import get_operator

_APE_KEYS = ("folnet.encoder.abs_pos_embd.weight", "folnet.encoder.pos_embd.weight")
_READERS = {"join", "mu", "assoc", "trans", "prod"}  # reader.1 (unary) / reader.2 (binary)


def read_official_config(path: str | Path) -> tuple[ModelConfig, dict[str, Any]]:
    """Translate a released ``.cfg`` into our `ModelConfig` (plus the raw JSON)."""
    path = Path(path)
    raw = read_json(path, what="released config")
    if not isinstance(raw, dict):
        raise FolnetError(f"{path}: expected a JSON object of config fields, got "
                          f"{type(raw).__name__}")

    def need(key: str):
        if key not in raw:
            raise FolnetError(f"{path}: missing field {key!r}")
        return raw[key]

    for key, want in (("hidden_act", "gelu"), ("boolean_type", "mlp")):
        if raw.get(key, want) != want:
            raise FolnetError(f"{path}: {key} = {raw[key]!r} is not supported (only {want!r})")
    if raw.get("diag_link", False):
        raise FolnetError(f"{path}: diag_link = true is not supported")
    # the released flags are independent: the absolute table is added to the unary atoms, the
    # relative embedding starts the binary stream (DESIGN.md section 3)
    ape, rpe = bool(raw.get("absolute_position")), bool(raw.get("relative_position"))
    mixer = need("mixer_ops")
    names = [[get_operator(n).symbol for n in (mixer.get(k) or [])] for k in ("1", "2")]
    ops = "".join(names[0]) + "." + "".join(names[1])
    pdims, idims = need("predicate_dims"), need("intermediate_dims")
    cfg = ModelConfig(
        ops=ops, D1=int(pdims[1]), D2=int(pdims[2]), L=int(need("num_layers")),
        H=int(need("num_heads")), S=int(need("head_size")), F1=int(idims[1]), F2=int(idims[2]),
        delta=int(need("max_position_offset")),
        position={(True, True): "ape+rpe", (True, False): "ape", (False, True): "rpe",
                  (False, False): "none"}[ape, rpe],
        vocab_size=int(need("vocab_size")), type_vocab_size=int(raw.get("type_vocab_size", 2)),
        dropout=float(raw.get("hidden_dropout_prob", 0.1)),
        layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
        initializer_range=float(raw.get("initializer_range", 0.02)),
    )
    return cfg, raw


class _Source:
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


def _map_layer(src: _Source, layer: DualStreamLayer, ours: str, theirs: str, out: dict) -> None:
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


def load_official(prefix: str | Path, *, head: str | None = "auto",
                  backend: str = "auto") -> FolnetModel:
    """Load ``prefix.cfg`` + ``prefix.pt`` (released format) into our model.

    ``head="auto"`` picks the head the checkpoint carries (pretraining, mlm, classification or
    none); pass a head name to insist on one, or None for the bare encoder (head keys are then
    left unused, which is allowed). ``backend`` forces the operators' backend
    (`folnet.ops.compiler.BACKEND_NAMES`).
    """
    prefix = str(prefix)
    cfg, _raw = read_official_config(prefix + ".cfg")
    cfg = cfg.replace(backend=backend)
    weights = Path(prefix + ".pt")
    if not weights.is_file():
        raise FolnetError(f"released weights {str(weights)!r} do not exist")
    try:
        sd = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise FolnetError(f"{weights}: cannot read the state dict safely ({exc})") from None
    if isinstance(sd, dict) and "model" in sd and isinstance(sd["model"], dict):
        sd = sd["model"]
    if not isinstance(sd, dict):
        raise FolnetError(f"{weights}: expected a state dict, got {type(sd).__name__}")
    src = _Source(sd, str(weights))
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
    num_labels = int(sd["classifier.weight"].shape[0]) if has_cls else 2
    model = FolnetModel(cfg, head=head, num_labels=num_labels)
    ours: dict[str, torch.Tensor] = {}
    shape = {n: tuple(p.shape) for n, p in model.state_dict().items()}
    e = "encoder."
    ours[f"{e}atoms.word.weight"] = src.take("folnet.encoder.word_embd.weight",
                                             shape[f"{e}atoms.word.weight"])
    ours[f"{e}atoms.token_type.weight"] = src.take("folnet.encoder.type_embd.weight",
                                                   shape[f"{e}atoms.token_type.weight"])
    if cfg.relative_atoms:
        ours[f"{e}atoms.relative.weight"] = src.take("folnet.encoder.rel_pos_embd.weight",
                                                     shape[f"{e}atoms.relative.weight"])
    if cfg.absolute_positions:
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
    left = sorted(k for k in sd if k not in src.used
                  and not (head is None and k.startswith(head_keys)))
    if left:
        raise FolnetError(f"{weights}: unknown or unused key(s) {left[:8]}"
                          f"{' ...' if len(left) > 8 else ''} for a {cfg.ops} model with head "
                          f"{head!r}")
    missing = sorted(set(shape) - set(ours))
    if missing:
        raise FolnetError(f"{weights}: no released key for parameter(s) {missing[:8]}")
    model.load_state_dict(ours, strict=True)
    return model.eval()
