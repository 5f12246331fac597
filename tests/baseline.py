"""A straightforward per-operator FOLNet: the tests' oracle and the benchmarks' baseline.

It runs the same function with the same parameters as a `folnet.FolnetModel` (it wraps one),
but the way a direct transcription of the paper would: one projection Linear per kernel and per
premise, the softmax materialised and then contracted with ``torch.einsum``, one output Linear
per operator, the binary FFN on an explicit concatenation with a materialised transpose, and
MLM logits for every token. tests/arch/test_baseline_equivalence.py checks folnet against it, and
benchmarks/train_step.py and long_memory.py measure folnet against it (they import it from
here: an oracle belongs with the tests).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from folnet.arch.layer.atoms import relative_position_ids, token_positions


class BaselineFolnet(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model  # parameters are shared: same weights, same optimizer state

    def _segment(self, proj, seg):
        w = proj.weight[seg.start : seg.start + seg.width]
        b = None
        if seg.bias:
            full = proj.full()
            b = full[seg.start : seg.start + seg.width]
        return w, b

    def _layer(self, layer, u1, u2):
        cfg = layer.cfg
        n1 = F.layer_norm(u1, (cfg.D1,), eps=cfg.layer_norm_eps)
        n2 = F.layer_norm(u2, (cfg.D2,), eps=cfg.layer_norm_eps)
        streams = {"U": (n1, layer.proj_u), "B": (n2, layer.proj_b)}
        add = {"U": 0, "B": 0}
        index = {"U": 0, "B": 0}
        for slot in layer.slots:
            spec = slot.spec
            tensors = {}
            for role, seg in (("kernel", slot.kernel), ("premise", slot.premise)):
                x, proj = streams[seg.stream]
                w, b = self._segment(proj, seg)
                t = F.linear(x, w, b).unflatten(-1, seg.channels)  # one Linear per tensor
                order = [c for c in spec.tensor(role) if c in "xya"] + [
                    c for c in spec.tensor(role) if c not in "xya"]
                tensors[role] = t.permute([0] + [1 + order.index(c) for c in spec.tensor(role)])
            k, v = tensors["kernel"] * slot.kernel_scale, tensors["premise"]
            if spec.activation == "softmax":
                k = torch.softmax(k, dim=1 + spec.kernel.index(spec.rdim))  # materialised
                if spec.kernel_dropout and self.training:
                    k = F.dropout(k, cfg.kernel_dropout)
            out = torch.einsum(spec.equation, k, v) * slot.out_scale
            order = [c for c in spec.output if c in "xya"] + [
                c for c in spec.output if c not in "xya"]
            out = out.permute([0] + [1 + spec.output.index(c) for c in order]).flatten(
                -len(spec.channels("output")))
            side = spec.typing.output
            oproj = layer.out_u if side == "U" else layer.out_b
            w = oproj.weight[:, slot.out_start : slot.out_start + slot.out_width]
            add[side] = add[side] + F.linear(out, w, oproj.bias[index[side]])
            index[side] += 1
        u1 = u1 + F.dropout(add["U"], cfg.dropout, self.training)
        u2 = u2 + F.dropout(add["B"], cfg.dropout, self.training)
        n1 = F.layer_norm(u1, (cfg.D1,), eps=cfg.layer_norm_eps)
        n2 = F.layer_norm(u2, (cfg.D2,), eps=cfg.layer_norm_eps)
        u1 = u1 + F.dropout(layer.ffn_u(n1), cfg.dropout, self.training)
        n2t = n2.transpose(1, 2).contiguous()  # a materialised transposed copy
        ffn = layer.ffn_b
        h = ffn.out(F.gelu(ffn.inp(torch.cat([n2, n2t], -1)))) + ffn.skip(n2t)
        u2 = u2 + F.dropout(h, cfg.dropout, self.training)
        return u1, u2

    def forward(self, input_ids, token_type_ids, mlm_labels=None, nsp_labels=None):
        m = self.model
        cfg = m.cfg
        rel = relative_position_ids(token_type_ids, cfg.delta) if cfg.relative_atoms else None
        T = input_ids.shape[1]
        u1, u2 = m.encoder.atoms(input_ids, token_type_ids,
                                 token_positions(None, T, input_ids.device), rel, T)
        for layer in m.encoder.layers:
            u1, u2 = self._layer(layer, u1, u2)
        u1 = F.layer_norm(u1, (cfg.D1,), eps=cfg.layer_norm_eps)
        u2 = F.layer_norm(u2, (cfg.D2,), eps=cfg.layer_norm_eps)
        pooled = torch.tanh(m.encoder.pooler(u1[:, 0]))
        logits = m.mlm(u1)[..., : cfg.vocab_size]  # every token, as the released code
        nsp = m.nsp(pooled)
        loss = None
        if mlm_labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), mlm_labels.flatten(),
                                   ignore_index=-100)
            loss = loss + F.cross_entropy(nsp.float(), nsp_labels)
        return SimpleNamespace(loss=loss, sequence_output=u1, relation_output=u2,
                               mlm_logits=logits, nsp_logits=nsp)


__all__ = ["BaselineFolnet"]
