"""Latent MoE kernels of the fast path (components ``moe_router`` and ``moe_experts``).

* ``fp_moe_router_kernel`` — one program per token: RMSNorm of x (prologue, the ffn norm),
  fp32 router logits against the fp32 router weight, sigmoid, + correction bias (selection only),
  top-k by repeated argmax (ties: lowest id), weights = selected sigmoid scores normalised over
  the k and scaled by ``routed_scaling``. Writes ids int32 [M, k] and weights fp32 [M, k].
* ``fp_moe_experts_up_kernel`` / ``fp_moe_experts_down_kernel`` — grouped routed experts in
  the latent width. Grid (expert, N-block): a program serves ONE expert, so only the selected
  experts' weights are read (programs of unselected experts exit at once) and each selected
  expert's weights are read once whatever the number of tokens routed to it. The (token, slot)
  pairs routed to the expert are compacted in registers (cumsum over the pair list, no sort
  kernel, no host sync), processed BLOCK_T at a time (``tl.dot`` when BLOCK_T ≥ 16).
  up:   h[pair] = silu(lat[tok] Wg[e]ᵀ) · (lat[tok] Wu[e]ᵀ)          (W13[e] = [gate; up])
  down: o[pair] = round(h[pair] W2[e]ᵀ) · weight[pair]   (fp32 [M, k, latent])
  The sum over the k slots happens in the prologue of the latent up-projection gemv
  (kernels/gemv.py, x of shape [M, k, latent]) — deterministic, no atomics.

Loop bounds are compile-time constants (Triton 3.6's interpreter cannot range over runtime
values); the token-tile loop runs to a constexpr bound and skips empty tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .entry import KernelSpec, default_dtypes


@triton.jit
def fp_moe_router_kernel(X, NW, RW, RB, IDS, WOUT, eps, scaling, stride_xm,
                         D: tl.constexpr, E: tl.constexpr, TOPK: tl.constexpr,
                         BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr):
    m = tl.program_id(0)
    re = tl.arange(0, BLOCK_E)
    rk = tl.arange(0, BLOCK_K)
    e_ok = re < E
    if NORM:
        ss = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, D, BLOCK_K):
            kk = k0 + rk
            xk = tl.load(X + m * stride_xm + kk, mask=kk < D, other=0.0).to(tl.float32)
            ss += xk * xk
        rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / D + eps)
    acc = tl.zeros([BLOCK_E], dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < D
        xk = tl.load(X + m * stride_xm + kk, mask=k_ok, other=0.0)
        if NORM:
            nw = tl.load(NW + kk, mask=k_ok, other=0.0).to(tl.float32)
            xk = (xk.to(tl.float32) * rstd * nw).to(X.dtype.element_ty)  # the normed x, rounded
        w = tl.load(RW + re[:, None] * D + kk[None, :], mask=e_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.sum(xk.to(tl.float32)[None, :] * w.to(tl.float32), axis=1)
    score = 1.0 / (1.0 + tl.exp(-acc))
    sel = score + tl.load(RB + re, mask=e_ok, other=0.0).to(tl.float32)
    sel = tl.where(e_ok, sel, float("-inf"))
    rt = tl.arange(0, TOPK)
    ids = tl.zeros([TOPK], dtype=tl.int32)
    ws = tl.zeros([TOPK], dtype=tl.float32)
    for j in tl.static_range(TOPK):
        best = tl.max(sel, axis=0)
        idx = tl.min(tl.where(sel == best, re, BLOCK_E), axis=0)  # lowest id among ties
        sc = tl.sum(tl.where(re == idx, score, 0.0), axis=0)
        ids = tl.where(rt == j, idx, ids)
        ws = tl.where(rt == j, sc, ws)
        sel = tl.where(re == idx, float("-inf"), sel)
    ws = ws / tl.sum(ws, axis=0) * scaling
    tl.store(IDS + m * TOPK + rt, ids)
    tl.store(WOUT + m * TOPK + rt, ws)


@triton.jit
def _count_of_expert(IDS, e, P, BLOCK_P: tl.constexpr):
    """Number of (token, slot) pairs routed to expert e."""
    rp = tl.arange(0, BLOCK_P)
    ids = tl.load(IDS + rp, mask=rp < P, other=-1)
    return tl.sum((ids == e).to(tl.int32), axis=0)


@triton.jit
def _pairs_of_expert(IDS, e, s0, P, BLOCK_P: tl.constexpr, BLOCK_T: tl.constexpr):
    """The s0..s0+BLOCK_T-th (token, slot) pairs routed to expert e: (pair index, valid mask)."""
    rp = tl.arange(0, BLOCK_P)
    ids = tl.load(IDS + rp, mask=rp < P, other=-1)
    sel = ids == e
    seli = sel.to(tl.int32)
    count = tl.sum(seli, axis=0)
    pos = tl.cumsum(seli, axis=0) - 1
    rs = s0 + tl.arange(0, BLOCK_T)
    hit = sel[None, :] & (pos[None, :] == rs[:, None])
    pair = tl.sum(tl.where(hit, rp[None, :], 0), axis=1)
    return pair, rs < count


@triton.jit
def fp_moe_experts_up_kernel(LAT, IDS, W13, H, P, stride_lm, stride_we, stride_wn, stride_hp,
                             L: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr,
                             MAX_T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_T: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr):
    e = tl.program_id(0)
    pid_n = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < I
    rk = tl.arange(0, BLOCK_K)
    count = _count_of_expert(IDS, e, P, BLOCK_P)
    if count > 0:
        wbase = W13 + e.to(tl.int64) * stride_we
        for s0 in tl.static_range(0, MAX_T, BLOCK_T):
            if s0 < count:
                pair, t_ok = _pairs_of_expert(IDS, e, s0, P, BLOCK_P, BLOCK_T)
                tok = pair // TOPK
                acc_g = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
                acc_u = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
                for k0 in range(0, L, BLOCK_K):
                    kk = k0 + rk
                    k_ok = kk < L
                    x = tl.load(LAT + tok[:, None] * stride_lm + kk[None, :],
                                mask=t_ok[:, None] & k_ok[None, :], other=0.0)
                    wm = n_ok[:, None] & k_ok[None, :]
                    wg = tl.load(wbase + rn[:, None] * stride_wn + kk[None, :], mask=wm, other=0.0)
                    wu = tl.load(wbase + (rn[:, None] + I) * stride_wn + kk[None, :], mask=wm, other=0.0)
                    if USE_DOT:
                        acc_g += tl.dot(x.to(wg.dtype), tl.trans(wg))
                        acc_u += tl.dot(x.to(wg.dtype), tl.trans(wu))
                    else:
                        xf = x.to(tl.float32)
                        acc_g += tl.sum(xf[:, None, :] * wg.to(tl.float32)[None, :, :], axis=2)
                        acc_u += tl.sum(xf[:, None, :] * wu.to(tl.float32)[None, :, :], axis=2)
                # round the projections like the standard path's matmul output, then SwiGLU
                g = acc_g.to(H.dtype.element_ty).to(tl.float32)
                u = acc_u.to(H.dtype.element_ty).to(tl.float32)
                h = g / (1.0 + tl.exp(-g)) * u
                tl.store(H + pair[:, None] * stride_hp + rn[None, :], h.to(H.dtype.element_ty),
                         mask=t_ok[:, None] & n_ok[None, :])


@triton.jit
def fp_moe_experts_down_kernel(Hb, IDS, RWT, W2, O, P, stride_hp, stride_we, stride_wn, stride_op,
                               L: tl.constexpr, I: tl.constexpr,
                               MAX_T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_T: tl.constexpr,
                               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr):
    e = tl.program_id(0)
    pid_n = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < L
    rk = tl.arange(0, BLOCK_K)
    count = _count_of_expert(IDS, e, P, BLOCK_P)
    if count > 0:
        wbase = W2 + e.to(tl.int64) * stride_we
        for s0 in tl.static_range(0, MAX_T, BLOCK_T):
            if s0 < count:
                pair, t_ok = _pairs_of_expert(IDS, e, s0, P, BLOCK_P, BLOCK_T)
                acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
                for k0 in range(0, I, BLOCK_K):
                    kk = k0 + rk
                    k_ok = kk < I
                    x = tl.load(Hb + pair[:, None] * stride_hp + kk[None, :],
                                mask=t_ok[:, None] & k_ok[None, :], other=0.0)
                    w = tl.load(wbase + rn[:, None] * stride_wn + kk[None, :],
                                mask=n_ok[:, None] & k_ok[None, :], other=0.0)
                    if USE_DOT:
                        acc += tl.dot(x.to(w.dtype), tl.trans(w))
                    else:
                        acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
                rw = tl.load(RWT + pair, mask=t_ok, other=0.0)
                y = acc.to(Hb.dtype.element_ty).to(tl.float32) * rw[:, None]
                tl.store(O + pair[:, None] * stride_op + rn[None, :], y.to(O.dtype.element_ty),
                         mask=t_ok[:, None] & n_ok[None, :])


# ------------------------------------------------------------------------------------- host
def _p2(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


def _cfg(kernel: str, M: int, device, config: dict | None) -> dict:
    if config is not None:
        return dict(config)
    from .. import tuning

    return tuning.lookup(kernel, M, device=device)


def moe_router(x, router_w, router_bias, top_k: int, *, routed_scaling: float = 1.0,
               norm_weight=None, eps: float = 1e-6, ids=None, weights=None, config=None):
    """Fused router. x [M, D] (working dtype; normalised here when ``norm_weight`` is given),
    router_w fp32 [E, D], router_bias fp32 [E]. Returns (ids int32 [M, k], weights fp32 [M, k])."""
    M, D = x.shape
    E = router_w.shape[0]
    assert top_k & (top_k - 1) == 0 or True
    cfg = _cfg("moe_router", M, x.device, config)
    if ids is None:
        ids = torch.empty((M, top_k), dtype=torch.int32, device=x.device)
    if weights is None:
        weights = torch.empty((M, top_k), dtype=torch.float32, device=x.device)
    TK = _p2(top_k)
    assert TK == top_k, "top_k must be a power of two"
    fp_moe_router_kernel[(M,)](
        x, norm_weight if norm_weight is not None else x, router_w, router_bias, ids, weights,
        float(eps), float(routed_scaling), x.stride(0),
        D=D, E=E, TOPK=top_k, BLOCK_E=_p2(E), BLOCK_K=int(cfg.get("BLOCK_K", 64)),
        NORM=norm_weight is not None, num_warps=int(cfg.get("num_warps", 4)),
    )
    return ids, weights


def moe_experts(lat, ids, weights, w13, w2, *, h_buf=None, out=None, config=None):
    """Grouped routed experts. lat [M, L] (working dtype), ids int32 [M, k], weights fp32 [M, k],
    w13 [E, 2I, L], w2 [E, L, I]. Returns o fp32 [M, k, L] (weighted per-slot outputs; sum
    over k is the MoE output in latent width)."""
    M, L = lat.shape
    k = ids.shape[1]
    E, I2, L2 = w13.shape
    I = I2 // 2
    assert L2 == L and w2.shape == (E, L, I)
    assert w13.stride(2) == 1 and w2.stride(2) == 1 and lat.stride(1) == 1
    ids = ids.contiguous()
    weights = weights.contiguous()
    cfg = _cfg("moe_experts", M, lat.device, config)
    P = M * k
    BT = int(cfg.get("BLOCK_T", 16))
    BT = max(1, min(BT, _p2(M)))
    use_dot = BT >= 16
    BN, BK = int(cfg["BLOCK_N"]), int(cfg["BLOCK_K"])
    if use_dot:
        BN, BK = max(BN, 16), max(BK, 16)
    MAX_T = triton.cdiv(M, BT) * BT
    if h_buf is None:
        h_buf = torch.empty((P, I), dtype=lat.dtype, device=lat.device)
    if out is None:
        out = torch.empty((M, k, L), dtype=torch.float32, device=lat.device)
    nw, ns = int(cfg.get("num_warps", 4)), int(cfg.get("num_stages", 3))
    fp_moe_experts_up_kernel[(E, triton.cdiv(I, BN))](
        lat, ids, w13, h_buf, P, lat.stride(0), w13.stride(0), w13.stride(1), h_buf.stride(0),
        L=L, I=I, TOPK=k, MAX_T=MAX_T, BLOCK_P=max(2, _p2(P)), BLOCK_T=BT, BLOCK_N=BN, BLOCK_K=BK,
        USE_DOT=use_dot, num_warps=nw, num_stages=ns,
    )
    o2 = out.view(P, L)
    fp_moe_experts_down_kernel[(E, triton.cdiv(L, BN))](
        h_buf, ids, weights, w2, o2, P, h_buf.stride(0), w2.stride(0), w2.stride(1), o2.stride(0),
        L=L, I=I, MAX_T=MAX_T, BLOCK_P=max(2, _p2(P)), BLOCK_T=BT, BLOCK_N=BN, BLOCK_K=BK,
        USE_DOT=use_dot, num_warps=nw, num_stages=ns,
    )
    return out


def variant_name(M: int, cfg: dict) -> str:
    bt = max(1, min(int(cfg.get("BLOCK_T", 16)), _p2(M)))
    return "triton_grouped_" + ("dot" if bt >= 16 else "small_m")


# ---------------------------------------------------------------------------- references
def router_reference(x, router_w, router_bias, top_k, *, routed_scaling=1.0, norm_weight=None,
                     eps=1e-6, dtype=None):
    """The standard path's routing (fp32 router on the normed x in ``dtype``)."""
    dt = dtype or x.dtype
    xx = x.to(dt)
    if norm_weight is not None:
        xf = xx.float()
        xx = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()).to(dt)
    scores = torch.sigmoid(xx.float() @ router_w.float().T)
    ids = torch.topk(scores + router_bias.float(), top_k, dim=-1).indices
    w = scores.gather(-1, ids)
    return ids.to(torch.int32), w / w.sum(-1, keepdim=True) * routed_scaling


def experts_reference(lat, ids, weights, w13, w2, *, dtype=None):
    """Per-slot weighted expert outputs fp32 [M, k, L] (loop over experts, torch ops in dtype)."""
    dt = dtype or lat.dtype
    M, k = ids.shape
    L = lat.shape[1]
    I = w13.shape[1] // 2
    out = torch.zeros(M, k, L, dtype=torch.float32, device=lat.device)
    x = lat.to(dt)
    for e in torch.unique(ids).tolist():
        rows, slot = (ids == e).nonzero(as_tuple=True)
        h = x[rows] @ w13[e].to(dt).T
        a, b = h[:, :I], h[:, I:]
        hh = (torch.nn.functional.silu(a.float()) * b.float()).to(dt)
        y = (hh @ w2[e].to(dt).T).float()
        out[rows, slot] = y * weights[rows, slot].float().unsqueeze(-1)
    return out


# ------------------------------------------------------------------------------ registry
def _on_gpu(device) -> bool:
    return str(device or "").startswith("cuda") or (device is None and torch.cuda.is_available())


def _router_entry(device=None) -> KernelSpec:
    def make_inputs(shape, value_class="normal", dtype=torch.float16, device="cpu", seed=0):
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        g = torch.Generator(device="cpu").manual_seed(seed)
        M, D, E, k = shape["M"], shape["D"], shape["E"], shape["k"]
        x = torch.randn(M, D, generator=g)
        rw = torch.randn(E, D, generator=g) / D ** 0.5
        rb = torch.randn(E, generator=g) * 0.1
        if value_class == "ties":  # many equal scores: the selection must still be consistent
            rw = rw[: max(1, E // 4)].repeat(4, 1)[:E].clone()
            rb = torch.zeros(E)
        elif value_class == "large":
            x = x * 50
        return {"x": x.to(dtype).to(device), "router_w": rw.float().to(device),
                "router_bias": rb.float().to(device),
                "norm_weight": (1 + 0.1 * torch.randn(D, generator=g)).to(dtype).to(device),
                "top_k": k, "routed_scaling": 2.5}

    def fast(**i):
        ids, w = moe_router(**i)
        return _canon(ids, w, i["router_w"].shape[0])

    def standard(**i):
        ids, w = router_reference(**i)
        return _canon(ids, w, i["router_w"].shape[0])

    def oracle(**i):
        j = {k: (v.float() if torch.is_tensor(v) else v) for k, v in i.items()}
        ids, w = router_reference(**j)
        return _canon(ids, w, i["router_w"].shape[0])

    shapes = ([{"M": m, "D": 4096, "E": 64, "k": 8} for m in (1, 2, 4, 8, 16, 32, 64)] + [{"M": 3, "D": 1000, "E": 48, "k": 4}]
              if _on_gpu(device) else [{"M": 1, "D": 64, "E": 8, "k": 2}, {"M": 5, "D": 96, "E": 12, "k": 4}])
    return KernelSpec(name="moe_router", component="moe_router", fast=fast, standard=standard, oracle=oracle,
                      make_inputs=make_inputs, shapes=shapes, value_classes=["normal", "large"],
                      dtypes=default_dtypes(device), kernel_patterns=[r"^fp_moe_router"])


def _canon(ids, w, E):
    """Routing as a dense [M, E] weight matrix (order of the k slots is irrelevant)."""
    dense = torch.zeros(ids.shape[0], E, dtype=torch.float32, device=ids.device)
    dense.scatter_(1, ids.long(), w.float())
    return dense


def _experts_entry(device=None) -> KernelSpec:
    def make_inputs(shape, value_class="normal", dtype=torch.float16, device="cpu", seed=0):
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        g = torch.Generator(device="cpu").manual_seed(seed)
        M, L, I, E, k = shape["M"], shape["L"], shape["I"], shape["E"], shape["k"]
        scale = {"normal": 1.0, "large": 8.0, "near_zero": 1e-3}.get(value_class, 1.0)
        lat = torch.randn(M, L, generator=g) * scale
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)]).to(torch.int32)
        w = torch.rand(M, k, generator=g) + 0.1
        return {"lat": lat.to(dtype).to(device), "ids": ids.to(device), "weights": w.float().to(device),
                "w13": (torch.randn(E, 2 * I, L, generator=g) / L ** 0.5).to(dtype).to(device),
                "w2": (torch.randn(E, L, I, generator=g) / I ** 0.5).to(dtype).to(device)}

    shapes = ([{"M": m, "L": 2048, "I": 1024, "E": 64, "k": 8} for m in (1, 2, 4, 8, 16, 32, 64)]
              + [{"M": 3, "L": 1000, "I": 520, "E": 16, "k": 4}]
              if _on_gpu(device) else
              [{"M": 1, "L": 32, "I": 32, "E": 8, "k": 2}, {"M": 5, "L": 48, "I": 40, "E": 6, "k": 2},
               {"M": 20, "L": 32, "I": 16, "E": 4, "k": 2}])
    return KernelSpec(
        name="moe_experts", component="moe_experts",
        fast=lambda **i: moe_experts(**i).sum(1),
        standard=lambda **i: experts_reference(**i).sum(1),
        oracle=lambda **i: experts_reference(**{k: (v.float() if v.is_floating_point() else v) for k, v in i.items()}).sum(1),
        make_inputs=make_inputs, shapes=shapes, value_classes=["normal", "large", "near_zero"],
        dtypes=default_dtypes(device), kernel_patterns=[r"^fp_moe_experts"],
        # fp32: the fp32 accumulation order differs from torch's (outputs up to O(100) for
        # "large"), the standard path on CPU IS the oracle (error 0), so the floor decides
        atol_floor={"float32": 1e-4, "float16": 1e-3, "bfloat16": 8e-3},
    )


def kernel_entry(device=None) -> list[KernelSpec]:
    return [_router_entry(device), _experts_entry(device)]
