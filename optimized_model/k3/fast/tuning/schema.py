"""What a tuning table may say: the kernels, each one's fields and their allowed values.

``check_table(data, filename)`` runs when a table file is loaded and raises ``TableError`` with
one line naming the file, the key and what is allowed, e.g.
``tuning table nvidia_h200.json: kernels.gemv.buckets[0].BLOCK_N = 7: must be a power of two``.
The decode step therefore never meets a value it cannot use (a table patched in memory, as the
GPU sweeps do, is the sweep's own responsibility).
"""

from __future__ import annotations

from typing import Any, Callable

# Where the step can ask the L2 for an upcoming weight (table data "l2_prefetch": site →
# fraction of the weight): the weight, and when the prefetch starts.
L2_SITES = {
    "kda_o": "KDA o_proj, after the in-projection (beside the gate projection and KDA decode)",
    "mla_o": "MLA o_proj, after the in-projection (beside q_b, the absorbed attention, W_uv)",
    "moe_up": "MoE latent up, when the routed experts start",
    "next_in": "the next layer's in-projection, when the MoE latent up starts",
}


class TableError(ValueError):
    """A tuning table that the fast path cannot use."""


# A check returns None when the value is allowed, else what is allowed (for the message).
Check = Callable[[Any], "str | None"]


def one_of(*allowed: Any) -> Check:
    def check(v: Any) -> str | None:
        ok = any(v == a and type(v) is type(a) for a in allowed)
        return None if ok else "must be one of " + ", ".join(repr(a) for a in allowed)
    return check


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def power_of_two(zero_means_default: bool = False) -> Check:
    def check(v: Any) -> str | None:
        if _is_int(v) and (v > 0 and v & (v - 1) == 0 or zero_means_default and v == 0):
            return None
        return "must be a power of two" + (" or 0 (the kernel's default)" if zero_means_default else "")
    return check


def positive_int(v: Any) -> str | None:
    return None if _is_int(v) and v > 0 else "must be a positive integer"


def positive_number(v: Any) -> str | None:
    return None if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else "must be a positive number"


def fraction(v: Any) -> str | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1
    return None if ok else "must be a fraction of the weight, 0 to 1"


def split_k(v: Any) -> str | None:
    return None if v == "auto" or _is_int(v) and v >= 1 else 'must be "auto" or an integer >= 1'


def text(v: Any) -> str | None:
    return None if isinstance(v, str) else "must be a string"


flag = one_of(0, 1)
num_warps = one_of(1, 2, 4, 8, 16, 32)
triton_only = one_of("triton")
pow2 = power_of_two()
pow2_or_default = power_of_two(zero_means_default=True)

# the shape keys an override matches on (tuning.SHAPE_KEYS) and their values
OVERRIDE_SHAPE = {"N": positive_int, "K": positive_int,
                  "epilogue": one_of("none", "residual", "swiglu", "sigmoid_gate")}

GEMV = {
    "BLOCK_M": pow2_or_default, "BLOCK_N": pow2, "BLOCK_K": pow2, "SPLIT_K": split_k,
    "target_programs": positive_int, "min_k_iters": positive_int, "max_split": positive_int,
    "num_warps": num_warps, "num_stages": positive_int, "prefetch": flag, "acc2d": flag,
    "variant": one_of("triton", "cute"),
    # the CuTe DSL twin's launch shape (variant "cute"; 0: its default)
    "warps": one_of(0, 1, 2, 4, 8, 16, 32), "rows_per_warp": pow2_or_default,
}

# kernel → field → check (every bucket also has max_batch, and may have a note)
KERNELS: dict[str, dict[str, Check]] = {
    "gemv": GEMV,
    "moe_experts": {
        "BLOCK_M": pow2_or_default, "BLOCK_T": pow2_or_default, "BLOCK_N": pow2, "BLOCK_K": pow2,
        "BLOCK_N_DOWN": pow2, "BLOCK_K_DOWN": pow2, "num_warps": num_warps,
        "num_warps_down": num_warps, "num_stages": positive_int, "variant": triton_only,
        "slot_sum": one_of("down", "latent_up"),
    },
    "moe_router": {
        "BLOCK_E": pow2, "BLOCK_M": pow2, "BLOCK_K": pow2, "num_warps": num_warps,
        "variant": triton_only, "align": one_of("fused", "launch"),
    },
    "norm_residual": {"BLOCK": pow2_or_default, "num_warps": num_warps, "variant": triton_only},
    "kda_decode": {
        "BLOCK_V": pow2_or_default, "num_warps": num_warps, "variant": triton_only,
        "low_rank_gates": one_of("fused", "gemv"), "early_weights": flag,
    },
    "mla_decode": {
        "variant": triton_only, "split_kv": one_of("auto"), "layout": one_of("head_major", "kv_major"),
        "BLOCK_H": pow2, "BLOCK_T": pow2, "num_warps": num_warps,
        "combine_programs_per_head": positive_int, "waves": positive_number,
        "max_splits": positive_int, "min_chunk": positive_int,
    },
    "sampler": {"variant": triton_only},
    "moe_schedule": {"shared_in": one_of("fused", "separate"), "latent_down": one_of("aux", "main")},
    "launch": {"pdl": one_of("all", "outside_moe", "off")},
    "l2_prefetch": {"chunk": positive_int, "per_program": positive_int, **{s: fraction for s in L2_SITES}},
}


def _fields(where: str, entry: Any, allowed: dict[str, Check]) -> None:
    if not isinstance(entry, dict):
        raise TableError(f"{where}: must be an object")
    for name, value in entry.items():
        if name not in allowed:
            raise TableError(f"{where}.{name}: unknown field; known: {', '.join(sorted(allowed))}")
        why = allowed[name](value)
        if why:
            raise TableError(f"{where}.{name} = {value!r}: {why}")


def _buckets(kernel: str, spec: Any) -> None:
    where = f"kernels.{kernel}"
    if not isinstance(spec, dict) or not isinstance(spec.get("buckets"), list) or not spec["buckets"]:
        raise TableError(f"{where}: must be {{\"buckets\": [ENTRY, ...]}} with at least one bucket")
    _fields(where, {k: v for k, v in spec.items() if k != "buckets"}, {"note": text})
    fields = {"max_batch": positive_int, "note": text, **KERNELS[kernel]}
    if kernel == "gemv":
        fields["overrides"] = lambda v: None if isinstance(v, list) else "must be a list of {N, K, epilogue, ...}"
    override_fields = {"note": text, **OVERRIDE_SHAPE, **GEMV}
    last = 0
    for n, bucket in enumerate(spec["buckets"]):
        here = f"{where}.buckets[{n}]"
        if not isinstance(bucket, dict) or "max_batch" not in bucket:
            raise TableError(f"{here}: must be an object with max_batch (the largest batch it serves)")
        _fields(here, bucket, fields)
        if bucket["max_batch"] <= last:
            raise TableError(f"{here}.max_batch = {bucket['max_batch']}: must be larger than the "
                             f"previous bucket's {last} (buckets in increasing order)")
        for m, over in enumerate(bucket.get("overrides", [])):
            _fields(f"{here}.overrides[{m}]", over, override_fields)
        if kernel == "moe_experts" and bucket.get("slot_sum") == "down":
            from ..kernels.moe import MAX_SLOT_SUM_TOKENS

            serves = bucket["max_batch"] if n + 1 < len(spec["buckets"]) else None  # the last: all beyond
            if serves is None or serves > MAX_SLOT_SUM_TOKENS:
                raise TableError(f"{here}.slot_sum = 'down': the down kernel sums the slots for at most "
                                 f"{MAX_SLOT_SUM_TOKENS} tokens, and this bucket serves "
                                 f"{'every batch beyond the others' if serves is None else f'up to {serves}'}; "
                                 "use 'latent_up' there")
        last = bucket["max_batch"]


def check_table(data: Any, filename: str) -> None:
    """Raise ``TableError`` ("tuning table FILE: KEY = VALUE: what is allowed") for the first
    thing in ``data`` the fast path could not use."""
    try:
        if not isinstance(data, dict):
            raise TableError("the file must hold an object {device, kernels}")
        _fields("", {k: v for k, v in data.items() if k != "kernels"}, {"device": text, "note": text})
        if "device" not in data or not isinstance(data.get("kernels"), dict):
            raise TableError("needs \"device\" (a name) and \"kernels\" (an object)")
        for kernel, spec in data["kernels"].items():
            if kernel not in KERNELS:
                raise TableError(f"kernels.{kernel}: unknown kernel; known: {', '.join(sorted(KERNELS))}")
            _buckets(kernel, spec)
    except TableError as exc:
        raise TableError(f"tuning table {filename}: {str(exc).lstrip('.')}") from None
