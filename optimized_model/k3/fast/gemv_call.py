"""One GEMV launch at a call site of the step, with the config the step plan gives that site.

An entry with ``"variant": "cute"`` runs the CuTe DSL twin where the call is in its scope, else
(after a trace event naming why) the Triton kernel; a split-K config gets its call site's own
scratch (allocated at the first launch, then reused: graph-safe).
"""

from __future__ import annotations

from typing import Any, Mapping

from fastpath import trace

from .kernels import gemv as G

# the Triton kernel's keywords the CuTe GEMV implements (RMSNorm prologue, residual epilogue)
CUTE_FUSIONS = {"norm_weight", "residual", "epilogue"}


class GemvLauncher:
    def __init__(self, device, eps: float):
        self.device = device
        self.eps = eps
        self._scratch: dict[tuple, G.GemvScratch] = {}

    def __call__(self, cfg: Mapping[str, Any], site: str, x, w, out, **kw) -> Mapping[str, Any]:
        """Launch; returns the config that ran (the trace names its variant)."""
        M = x.shape[0]
        N = w.shape[0] // 2 if kw.get("epilogue") == "swiglu" else w.shape[0]
        if cfg.get("variant") == "cute":
            ran = self._cute(site, x, w, out, cfg, kw)
            if ran is not None:
                return ran
            cfg = {**cfg, "variant": "triton"}
        scratch = None
        if int(cfg.get("SPLIT_K", 1)) > 1 and "groups" not in kw:
            key = (site, M, int(cfg["SPLIT_K"]))  # a retuned table (A/B of variants) gets its own
            scratch = self._scratch.get(key)
            if scratch is None:
                scratch = self._scratch[key] = G.GemvScratch(M, N, int(cfg["SPLIT_K"]), kw.get("epilogue") == "swiglu", self.device)
        G.gemv(x, w, out=out, config=cfg, scratch=scratch, eps=self.eps, **kw)
        return cfg

    def _cute(self, site: str, x, w, out, cfg, kw: dict):
        """The CuTe DSL GEMV; None (after a trace event naming why) when the call is outside its
        scope, and the caller runs Triton."""
        from .kernels import cute_gemv

        why = ""
        extra = sorted(set(kw) - CUTE_FUSIONS)
        if extra or kw.get("epilogue", "none") not in ("none", "residual"):
            why = f"fusion {extra or kw['epilogue']} not in the CuTe kernel (RMSNorm prologue, residual epilogue only)"
        else:
            residual = kw.get("residual") if kw.get("epilogue") == "residual" else None
            ok, why = cute_gemv.supports(x, w, out=out, norm_weight=kw.get("norm_weight"), residual=residual)
            if ok:
                cute_gemv.gemv(x, w, out=out, norm_weight=kw.get("norm_weight"), residual=residual,
                               eps=self.eps, warps=int(cfg.get("warps", 0)) or None,
                               rows_per_warp=int(cfg.get("rows_per_warp", 0)) or None)
                return cfg
        trace.engaged("dense_gemv", "triton_for_cute", site=site, batch=x.shape[0], reason=why)
        return None
