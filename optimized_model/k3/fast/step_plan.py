"""The step plan: every choice the tuning table makes for one batch size, resolved once.

``build_plan`` reads the table (all of it: GEMV configs per call site, dependent launch, L2
prefetch, MoE schedule, router and experts configs, where the slots are summed, KDA gates, MLA
split policy) and returns a frozen ``StepPlan``; the decode step reads only the plan. The table
was checked when it was loaded (tuning.schema), so nothing here validates.

A plan remembers the table it came from (``source``): a sweep that swaps the table for another
(``sweep_util.apply_patch`` replaces ``table["kernels"]``) gets a new plan at the next step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from . import tuning
from .kernels import moe as MOE
from .packed import KdaWeights, MlaWeights, MoeWeights, PackedLayer


@dataclass(frozen=True)
class L2PrefetchPlan:
    """Table data "l2_prefetch": site (schema.L2_SITES) → fraction of that weight to prefetch."""
    fractions: Mapping[str, float]
    chunk: int = 16384  # bytes per prefetch
    per_program: int = 32  # prefetches per program

    def fraction(self, site: str) -> float:
        return float(self.fractions.get(site, 0.0))


@dataclass(frozen=True)
class KdaPlan:
    fused_gates: bool  # KDA decode forms f and the output gate from f_a(x), g_a(x) itself
    block_v: int | None
    num_warps: int | None
    early_weights: bool


@dataclass(frozen=True)
class MlaPlan:
    """mla_decode's split-KV policy and tiles (its keyword arguments)."""
    block_h: int
    layout: str
    block_t: int | None
    num_warps: int | None
    min_chunk: int
    max_splits: int
    waves: float
    combine_programs_per_head: int


@dataclass(frozen=True)
class MoePlan:
    shared_in_fused: bool  # one launch streams [latent down; shared gate|up] (else separate)
    latent_down_beside_router: bool  # separate schedule, CUDA only: latent down on the aux stream
    router_config: Mapping[str, Any]
    align_in_router: bool  # the by-expert grouping in the router's last program (else its own launch)
    experts_config: Mapping[str, Any]
    experts_block_m: int
    slot_sum_in_down: bool  # the experts' down kernel sums the slots (else the latent up's prologue)


@dataclass(frozen=True)
class StepPlan:
    batch: int
    pdl: str  # dependent launch: "all" | "outside_moe" (not in the MoE layers) | "off"
    l2: L2PrefetchPlan
    gemv: Mapping[str, Mapping[str, Any]]  # call site ("L3.in", "lm_head", ...) → GEMV config
    kda: KdaPlan | None  # None: no layer of that kind
    mla: MlaPlan | None
    moe: MoePlan | None
    source: Any = field(default=None, compare=False, repr=False)  # the table's "kernels" object

    @property
    def pdl_in_moe(self) -> bool:
        return self.pdl == "all"


def _frozen(d: dict) -> Mapping[str, Any]:
    return MappingProxyType(dict(d))


def _pdl(kernels: dict, B: int, device) -> str:
    # never on the CPU (the interpreter's table has no "launch" entry either)
    if device.type == "cpu" or "launch" not in kernels:
        return "off"
    return str(tuning.entry("launch", B, device=device).get("pdl", "off"))


def _l2(kernels: dict, B: int, device, on_cuda: bool) -> L2PrefetchPlan:
    # none on CPU (no PTX) or where the table has no entry
    if not on_cuda or "l2_prefetch" not in kernels:
        return L2PrefetchPlan(_frozen({}))
    e = tuning.entry("l2_prefetch", B, device=device)
    return L2PrefetchPlan(_frozen({k: v for k, v in e.items() if k in tuning.L2_SITES}),
                          chunk=int(e.get("chunk", 16384)), per_program=int(e.get("per_program", 32)))


def _kda(B: int, device) -> KdaPlan:
    e = tuning.entry("kda_decode", B, device=device)
    return KdaPlan(fused_gates=e.get("low_rank_gates", "gemv") == "fused",
                   block_v=int(e.get("BLOCK_V", 0)) or None, num_warps=int(e.get("num_warps", 0)) or None,
                   early_weights=bool(e.get("early_weights", 0)))


def _mla(B: int, device) -> MlaPlan:
    from .kernels.mla_decode import MAX_SPLITS, MIN_CHUNK, WAVES

    e = tuning.entry("mla_decode", B, device=device)
    return MlaPlan(block_h=int(e.get("BLOCK_H", 16)), layout=e.get("layout", "head_major"),
                   block_t=e.get("BLOCK_T"), num_warps=e.get("num_warps"),
                   min_chunk=int(e.get("min_chunk", MIN_CHUNK)), max_splits=int(e.get("max_splits", MAX_SPLITS)),
                   waves=float(e.get("waves", WAVES)),
                   combine_programs_per_head=int(e.get("combine_programs_per_head", 1)))


def _moe(kernels: dict, B: int, device, on_cuda: bool) -> MoePlan:
    # tables without "moe_schedule": separate, latent down on the main stream
    sched = tuning.entry("moe_schedule", B, device=device) if "moe_schedule" in kernels else {}
    router = tuning.lookup("moe_router", B, device=device)
    experts = tuning.lookup("moe_experts", B, device=device)
    return MoePlan(shared_in_fused=sched.get("shared_in") == "fused",
                   latent_down_beside_router=on_cuda and sched.get("latent_down") == "aux",
                   router_config=_frozen(router), align_in_router=router.get("align", "fused") == "fused",
                   experts_config=_frozen(experts), experts_block_m=MOE.experts_block_m(B, experts),
                   slot_sum_in_down=experts.get("slot_sum", "latent_up") == "down")


def _gemv_sites(cfg: Any, layers: list[PackedLayer], head, kda: KdaPlan | None,
                moe: MoePlan | None) -> dict[str, tuple[int, int, str]]:
    """Every GEMV call site of the step → (N, K, epilogue), the shape its table entry is for
    (a SwiGLU gemv's N is half its gate|up rows)."""
    def plain(w, epi="none"):
        return w.shape[0], w.shape[1], epi

    def swiglu(w):
        return w.shape[0] // 2, w.shape[1], "swiglu"

    sites = {}
    for i, p in enumerate(layers):
        a, f = p.attn, p.ffn
        sites[f"L{i}.in"] = plain(a.w_in)
        if isinstance(a, KdaWeights):
            if not kda.fused_gates:
                sites[f"L{i}.fg"] = plain(a.w_fg)
        elif isinstance(a, MlaWeights):
            sites[f"L{i}.q_b"] = plain(a.q_b)
            # the grouped per-head gemvs: q·W_uk [C x nope] and W_uv [v x C] with the gate
            sites[f"L{i}.uk"] = (cfg.kv_lora, cfg.qk_nope, "none")
            sites[f"L{i}.uv"] = (cfg.v_head, cfg.kv_lora, "sigmoid_gate")
        sites[f"L{i}.o"] = plain(a.o_proj, "residual")
        if isinstance(f, MoeWeights):
            if moe.shared_in_fused:
                sites[f"L{i}.moe_in"] = plain(f.moe_in)
            else:
                sites[f"L{i}.down"] = plain(f.moe_down)
                sites[f"L{i}.sw13"] = swiglu(f.sw13)
            sites[f"L{i}.sw2"] = plain(f.sw2, "residual")
            sites[f"L{i}.up"] = plain(f.moe_up, "residual")
        else:
            sites[f"L{i}.w13"] = swiglu(f.w13)
            sites[f"L{i}.w2"] = plain(f.w2, "residual")
    sites["lm_head"] = plain(head)
    return sites


def build_plan(cfg: Any, layers: list[PackedLayer], head: Any, B: int, device, on_cuda: bool) -> StepPlan:
    """The plan of a step of ``B`` sequences over ``layers`` (and the head weight ``head``)."""
    kernels = tuning.table_for(device)["kernels"]
    kinds = {p.kind for p in layers}
    kda = _kda(B, device) if "kda" in kinds else None
    mla = _mla(B, device) if kinds - {"kda"} else None
    moe = _moe(kernels, B, device, on_cuda) if any(p.ffn_kind == "moe" for p in layers) else None
    gemv = {site: _frozen(tuning.lookup("gemv", B, device=device, N=N, K=K, epilogue=epi))
            for site, (N, K, epi) in _gemv_sites(cfg, layers, head, kda, moe).items()}
    return StepPlan(batch=B, pdl=_pdl(kernels, B, device), l2=_l2(kernels, B, device, on_cuda),
                    gemv=MappingProxyType(gemv), kda=kda, mla=mla, moe=moe, source=kernels)


def is_current(plan: StepPlan, device) -> bool:
    """Whether ``plan`` still describes the table in use (not swapped by a sweep since)."""
    return plan.source is tuning.table_for(device)["kernels"]
