"""Kimi Delta Attention (KDA) recurrence in plain PyTorch: step-by-step, one decode step, and a
chunked form for prefill. All math in fp32.

Convention (identical to fla-core's ``naive_recurrent_kda``): tensors are ``[B, T, H, K]`` (q, k),
``[B, T, H, V]`` (v), ``g`` is the per-channel log-decay ``[B, T, H, K]`` (<= 0), ``beta``
``[B, T, H]``; the state ``S`` is ``[B, H, K, V]`` fp32 and per step::

    S <- Diag(exp(g_t)) S                      # per-channel forget
    S <- S + beta_t k_t (v_t - S^T k_t)^T       # delta rule, i.e. S = (I - b k k^T) D S + b k v^T
    o_t = (scale * q_t)^T S                     # scale defaults to K ** -0.5

Chunked form (chunk of C steps, state S0 at its start, G_t = cumulative sum of g inside the
chunk, so every decay factor used is exp(G_t - G_j) <= 1 for j <= t — numerically safe even at
the -5 lower bound): the delta-rule innovations d_t = beta_t (v_t - S'_t^T k_t) satisfy the unit
lower-triangular system

    d_t + beta_t sum_{j<t} (k_t . exp(G_t - G_j) k_j) d_j = beta_t (v_t - S0^T (exp(G_t) k_t))

then  o_t = scale (q_t^T exp(G_t) S0 + sum_{j<=t} (q_t . exp(G_t - G_j) k_j) d_j)  and
S_C = exp(G_C) S0 + sum_j (exp(G_C - G_j) k_j) d_j^T.
"""

from __future__ import annotations

import torch


def kda_recurrent(q, k, v, g, beta, scale=None, initial_state=None):
    """Step-by-step recurrence. Returns (o [B,T,H,V] fp32, S [B,H,K,V] fp32)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.float().clone()
    o = q.new_empty(B, T, H, V)
    for t in range(T):
        o[:, t] = kda_step_(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], S, scale)
    return o, S


def kda_step_(q, k, v, g, beta, S, scale):
    """One step for [B, H, *] inputs; updates S [B,H,K,V] fp32 in place; returns o [B,H,V] fp32."""
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    S.mul_(g.exp().unsqueeze(-1))
    kS = torch.einsum("bhk,bhkv->bhv", k, S)
    S.add_(torch.einsum("bhk,bhv->bhkv", k, beta.unsqueeze(-1) * (v - kS)))
    return torch.einsum("bhk,bhkv->bhv", q * scale, S)


def kda_chunked(q, k, v, g, beta, scale=None, initial_state=None, chunk: int = 32):
    """Chunked prefill form (see module docstring). Same result as ``kda_recurrent``.
    Returns (o [B,T,H,V] fp32, S [B,H,K,V] fp32)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    pad = (-T) % chunk
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    if pad:  # padded steps: g = 0, beta = 0 leave the state unchanged
        q, k, v, g = (torch.nn.functional.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v, g))
        beta = torch.nn.functional.pad(beta, (0, 0, 0, pad))
    n = (T + pad) // chunk
    # -> [B, H, n, C, *]
    q, k, v, g = (t.view(B, n, chunk, H, -1).permute(0, 3, 1, 2, 4) for t in (q, k, v, g))
    beta = beta.view(B, n, chunk, H).permute(0, 3, 1, 2)
    G = g.cumsum(-2)
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.float().clone()
    o = q.new_empty(B, H, n, chunk, V)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    strict = causal.clone().fill_diagonal_(False)
    eye = torch.eye(chunk, device=q.device)
    for c in range(n):
        qc, kc, vc, Gc, bc = q[:, :, c], k[:, :, c], v[:, :, c], G[:, :, c], beta[:, :, c]
        diff = Gc.unsqueeze(-2) - Gc.unsqueeze(-3)  # [B,H,t,j,K] = G_t - G_j
        decay = diff.masked_fill(~causal[:, :, None], float("-inf")).exp()
        A_kk = torch.einsum("bhtk,bhtjk,bhjk->bhtj", kc, decay, kc) * strict
        A_qk = torch.einsum("bhtk,bhtjk,bhjk->bhtj", qc, decay, kc)
        rhs = bc.unsqueeze(-1) * (vc - (kc * Gc.exp()) @ S)
        L = eye + bc.unsqueeze(-1) * A_kk
        d = torch.linalg.solve_triangular(L, rhs, upper=False, unitriangular=True)
        o[:, :, c] = scale * ((qc * Gc.exp()) @ S + A_qk @ d)
        last = Gc[:, :, -1:]  # [B,H,1,K]
        S = S * last.squeeze(-2).exp().unsqueeze(-1) + ((last - Gc).exp() * kc).transpose(-1, -2) @ d
    o = o.permute(0, 2, 3, 1, 4).reshape(B, n * chunk, H, V)[:, :T]
    return o, S
