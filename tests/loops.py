"""Plain Python-loop implementations of the paper's Table 2 formulas (float64 references).

Written independently of the spec machinery: each function spells out its operator's sum with
nested loops over Python floats, including the softmax over the R-dim and the causal rule
(reduction over a <= x; Table 5 masks); then the same for the tests' custom operators. Used only
by the tests.
"""

from __future__ import annotations

import math

import torch


def _softmax(values: list[float]) -> list[float]:
    finite = [v for v in values if v is not None]
    top = max(finite)
    exps = [0.0 if v is None else math.exp(v - top) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


def loop_b(K: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # u_hs(x) = sum_w K_hw(x) v_ws(x); K (B,T,H,W), v (B,T,W,S)
    B, T, H, W = K.shape
    S = v.shape[-1]
    u = torch.zeros(B, T, H, S, dtype=torch.float64)
    for b in range(B):
        for x in range(T):
            for h in range(H):
                for s in range(S):
                    u[b, x, h, s] = sum(float(K[b, x, h, w]) * float(v[b, x, w, s])
                                        for w in range(W))
    return u


def loop_c(K, v, causal=False):
    # released cjoin: u_sh(x) = sum_a softmax_a(K_sh(a)) v_s(a, x); K (B,A,S,H), v (B,A,X,S)
    # causal: reduction over a <= x and premise pairs (a, x) kept when x <= a.
    B, T, S, H = K.shape
    u = torch.zeros(B, T, S, H, dtype=torch.float64)
    for b in range(B):
        for x in range(T):
            for s in range(S):
                for h in range(H):
                    logits = [float(K[b, a, s, h]) if (not causal or a <= x) else None
                              for a in range(T)]
                    p = _softmax(logits)
                    u[b, x, s, h] = sum(
                        p[a] * float(v[b, a, x, s]) * (1.0 if (not causal or x <= a) else 0.0)
                        for a in range(T))
    return u


def loop_j(K, v, causal=False):
    # u_hs(x) = sum_a softmax_a(K_h(x, a)) v_hs(a); K (B,X,A,H), v (B,A,H,S)
    B, T, _, H = K.shape
    S = v.shape[-1]
    u = torch.zeros(B, T, H, S, dtype=torch.float64)
    for b in range(B):
        for x in range(T):
            for h in range(H):
                p = _softmax([float(K[b, x, a, h]) if (not causal or a <= x) else None
                              for a in range(T)])
                for s in range(S):
                    u[b, x, h, s] = sum(p[a] * float(v[b, a, h, s]) for a in range(T))
    return u


def loop_m(K, v, causal=False):
    # u_hs(x) = sum_a softmax_a(K_h(x, a)) v_s(x, a); K (B,X,A,H), v (B,X,A,S)
    B, T, _, H = K.shape
    S = v.shape[-1]
    u = torch.zeros(B, T, H, S, dtype=torch.float64)
    for b in range(B):
        for x in range(T):
            for h in range(H):
                p = _softmax([float(K[b, x, a, h]) if (not causal or a <= x) else None
                              for a in range(T)])
                for s in range(S):
                    u[b, x, h, s] = sum(p[a] * float(v[b, x, a, s]) for a in range(T))
    return u


def loop_a(K, v):
    # u_h(x, y) = sum_w K_hw(x) v_hw(y); K (B,X,H,W), v (B,Y,H,W)
    B, T, H, W = K.shape
    u = torch.zeros(B, T, T, H, dtype=torch.float64)
    for b in range(B):
        for x in range(T):
            for y in range(T):
                for h in range(H):
                    u[b, x, y, h] = sum(float(K[b, x, h, w]) * float(v[b, y, h, w])
                                        for w in range(W))
    return u


def loop_p(K, v, causal=False):
    # u_h(x, y) = sum_w K_hw(x) v_w(x, y); K (B,X,H,W), v (B,X,Y,W); causal: y <= x
    B, T, H, W = K.shape
    u = torch.zeros(B, T, T, H, dtype=torch.float64)
    for b in range(B):
        for x in range(T):
            for y in range(T):
                if causal and y > x:
                    continue
                for h in range(H):
                    u[b, x, y, h] = sum(float(K[b, x, h, w]) * float(v[b, x, y, w])
                                        for w in range(W))
    return u


def loop_t(K, v, causal=False):
    # u_h(x, y) = sum_a softmax_a(K_h(x, a)) v_h(a, y); K (B,X,A,H), v (B,A,Y,H)
    # causal: a <= x in the kernel, y <= a in the premise.
    B, T, _, H = K.shape
    u = torch.zeros(B, T, T, H, dtype=torch.float64)
    for b in range(B):
        for x in range(T):
            for h in range(H):
                p = _softmax([float(K[b, x, a, h]) if (not causal or a <= x) else None
                              for a in range(T)])
                for y in range(T):
                    u[b, x, y, h] = sum(
                        p[a] * float(v[b, a, y, h]) * (1.0 if (not causal or y <= a) else 0.0)
                        for a in range(T))
    return u


def loop_bprod(K, v):
    # the tests' custom operator bprod (q: B <- B x U):
    # u_h(x, y) = sum_w K_w(x, y) v_hw(x); K (B,X,Y,W), v (B,X,H,W)
    B, T, _, W = K.shape
    H = v.shape[2]
    u = torch.zeros(B, T, T, H, dtype=torch.float64)
    for b in range(B):
        for x in range(T):
            for y in range(T):
                for h in range(H):
                    u[b, x, y, h] = sum(float(K[b, x, y, w]) * float(v[b, x, h, w])
                                        for w in range(W))
    return u


def loop_trans_first(K, v):
    # the tests' custom operator trans_first (r: B <- B x B; conftest.py's trans_first), t's
    # kernel transposed: u_h(x, y) = sum_a softmax_a(K_h(a, x)) v_h(a, y); K (B,A,X,H), v (B,A,Y,H)
    B, T, _, H = K.shape
    u = torch.zeros(B, T, T, H, dtype=torch.float64)
    for b in range(B):
        for x in range(T):
            for h in range(H):
                p = _softmax([float(K[b, a, x, h]) for a in range(T)])
                for y in range(T):
                    u[b, x, y, h] = sum(p[a] * float(v[b, a, y, h]) for a in range(T))
    return u


LOOPS = {"b": loop_b, "c": loop_c, "j": loop_j, "m": loop_m, "a": loop_a, "p": loop_p,
         "t": loop_t}
CAUSAL_LOOPS = {"c", "j", "m", "p", "t"}
