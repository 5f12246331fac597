"""An independent float64 reference of the released FOLNet encoder (docs/design.md section 3),
computed straight from a released-format state dict (``NAME.pt`` keys) with the loop
implementations of tests/loops.py for the operators. Slow; for a few tokens only. Used by the
tests only, never by the library."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from loops import loop_a, loop_c, loop_j, loop_m, loop_p, loop_t


def _ln(x: torch.Tensor, eps: float) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps)


def relative_id(t: int, tau: int, same_segment: bool, delta: int) -> int:
    if t == 0 and tau == 0:
        return 0
    if t == 0:
        return 2 * delta
    if tau == 0:
        return 2 * delta + 1
    if not same_segment:
        return delta
    if tau >= t:
        return min(tau - t, delta - 1)
    return 2 * delta - min(t - tau, delta - 1)


def released_forward(sd: dict, cfg: dict, ids: torch.Tensor, types: torch.Tensor) -> dict:
    """Outputs of the released encoder with its MLM and NSP heads (float64)."""
    w = {k: v.double() for k, v in sd.items()}
    eps = float(cfg.get("layer_norm_eps", 1e-12))
    H, S, delta = cfg["num_heads"], cfg["head_size"], cfg["max_position_offset"]
    D2 = cfg["predicate_dims"][2]
    B, T = ids.shape

    def lin(x, name, bias=True):
        out = x @ w[name + ".weight"].T
        return out + w[name + ".bias"] if bias and name + ".bias" in w else out

    u1 = w["folnet.encoder.word_embd.weight"][ids] + w["folnet.encoder.type_embd.weight"][types]
    if cfg.get("absolute_position"):
        u1 = u1 + w["folnet.encoder.abs_pos_embd.weight"][:T]
    u1 = _ln(u1, eps)
    if cfg.get("relative_position"):
        rid = torch.tensor([[[relative_id(t, tau, bool(types[b, t] == types[b, tau]), delta)
                              for tau in range(T)] for t in range(T)] for b in range(B)])
        u2 = _ln(w["folnet.encoder.rel_pos_embd.weight"][rid], eps)
    else:
        u2 = torch.zeros(B, T, T, D2, dtype=torch.float64)
    for i in range(cfg["num_layers"]):
        layer = f"folnet.reasoner.layers.{i}.deducers."
        n1, n2 = _ln(u1, eps), _ln(u2, eps)
        add1, add2 = torch.zeros_like(u1), torch.zeros_like(u2)
        for side in ("1", "2"):
            for k, name in enumerate(cfg["mixer_ops"].get(side) or []):
                op = f"{layer}0.operators.{side}.{k}."
                if name == "join":  # kernel (x, a, h) from u2, premise (a, h, s) from u1
                    out = loop_j(lin(n2, op + "reader.2", False),
                                 lin(n1, op + "reader.1").view(B, T, H, S))
                elif name == "mu":  # one reader: H kernel then S premise channels
                    r = lin(n2, op + "reader.2", False)
                    out = loop_m(r[..., :H], r[..., H:])
                elif name == "cjoin":  # kernel (a, s, h), premise v_s(a, y)
                    K = lin(n1, op + "kernel", False).view(B, T, S, H)
                    out = loop_c(K, lin(n2, op + "premise"))
                elif name == "assoc":
                    qk = lin(n1, op + "reader.1") / S**0.25
                    half = qk.shape[-1] // 2
                    out = loop_a(qk[..., :half].view(B, T, H, S), qk[..., half:].view(B, T, H, S))
                elif name == "trans":
                    r = lin(n2, op + "reader.2", False)
                    out = loop_t(r[..., :D2], r[..., D2:])
                elif name == "prod":
                    K = (lin(n1, op + "reader.1") / S**0.25).view(B, T, H, S)
                    out = loop_p(K, lin(n2, op + "reader.2") / S**0.25)
                else:
                    raise ValueError(f"no reference for operator {name!r}")
                writer = op + ("output" if name == "cjoin" else "writer")
                flat = out.flatten(3) if side == "2" else out.flatten(2)
                if side == "1":
                    add1 = add1 + lin(flat, writer)
                else:
                    add2 = add2 + lin(out, writer)
        u1, u2 = u1 + add1, u2 + add2
        ffn = f"{layer}1.operators."
        u1 = u1 + lin(F.gelu(lin(_ln(u1, eps), ffn + "1.0.clause_in")), ffn + "1.0.clause_out")
        n2 = _ln(u2, eps)
        n2t = n2.transpose(1, 2)
        hidden = F.gelu(lin(torch.cat([n2, n2t], -1), ffn + "2.0.clause_in"))
        u2 = u2 + lin(hidden, ffn + "2.0.clause_out") + lin(n2t, ffn + "2.0.clause_skip")
    u1, u2 = _ln(u1, eps), _ln(u2, eps)
    pooled = torch.tanh(lin(u1[:, 0], "folnet.dense"))
    h = _ln(F.gelu(lin(u1, "cls.heads.predictions.transform.dense")), eps)
    mlm = h @ w["folnet.encoder.word_embd.weight"].T + w["cls.heads.predictions.bias"]
    vocab = cfg["vocab_size"]
    return {"sequence_output": u1, "pooled_output": pooled, "relation_output": u2,
            "mlm_logits": mlm[..., :vocab], "nsp_logits": lin(pooled, "cls.heads.seq_relationship")}


