"""The standard path made differentiable: ``K3Model.prefill_forward`` under autograd, on fp32
master weights.

Each step the master weights are cast to the compute dtype *inside* the autograd graph (bf16 on
the GPU, as ``torch.autocast`` casts a weight for a matmul), so the model runs exactly the code
and dtypes of inference — fla-core's ``chunk_kda`` (whose backward is fla's), the grouped-matmul
MoE, the fp32 router — and every gradient lands on an fp32 master. Not ``torch.autocast`` itself:
the model casts its activations to the dtype of its residual stream (``x.dtype``), so with fp32
weights under autocast the KDA kernels and the MoE would run in fp32 / the per-expert loop.
The token embedding is looked up in fp32 and then cast (``embed`` seam), so its gradient is
accumulated over the batch in fp32, not by bf16 atomics.

The router's correction bias is not a parameter: DeepSeek-V3's auxiliary-loss-free balancing
moves it by the load it records here (``balance.update_router_biases``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from optimized_model.k3.config import K3Config
from optimized_model.k3.model import K3Model
from optimized_model.k3.weights import FP32_NAMES, init_weights

BIAS = "router_bias"


def is_bias(name: str) -> bool:
    return name.endswith("." + BIAS)


def no_decay(name: str) -> bool:
    """Norm weights, decay parameters and 1-d tensors get no weight decay."""
    leaf = name.split(".")[-1]
    return leaf.endswith("norm") or leaf in ("A_log", "dt_bias", "conv")


class TrainableK3(K3Model):
    def __init__(self, cfg: K3Config, master: dict[str, torch.Tensor], *, compute_dtype: torch.dtype,
                 kda_backend: str | None = None, moe_backend: str | None = None):
        self.master = master  # fp32; every tensor but the router biases requires grad
        self.compute_dtype = compute_dtype
        self.loads: dict[int, torch.Tensor] = {}
        self._valid: torch.Tensor | None = None
        super().__init__(cfg, self._compute_weights(), kda_backend=kda_backend, moe_backend=moe_backend)

    @classmethod
    def create(cls, cfg: K3Config, *, device, compute_dtype=torch.bfloat16, seed: int = 0, **kw) -> "TrainableK3":
        """Fresh weights: ``weights.init_weights`` (the random-model initialisation) in fp32."""
        w = init_weights(cfg, device=device, dtype=torch.float32, seed=seed)
        master = {n: t.detach().clone().requires_grad_(not is_bias(n)) for n, t in w.items()}
        return cls(cfg, master, compute_dtype=compute_dtype, **kw)

    def trainable_parameters(self) -> dict[str, torch.Tensor]:
        return {n: t for n, t in self.master.items() if not is_bias(n)}

    def _compute_weights(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, t in self.master.items():
            keep = name.split(".")[-1] in FP32_NAMES or t.dtype == self.compute_dtype
            out[name] = t if keep else t.to(self.compute_dtype)
        # the prefill looks the embedding up itself (embed); this copy only gives the model its dtype
        out["embed"] = self.master["embed"].detach().to(self.compute_dtype)
        return out

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.master["embed"]).to(self.compute_dtype)

    def route(self, i, x):
        ids, w = super().route(i, x)
        valid = self._valid if self._valid is not None else torch.ones(ids.shape[0], dtype=torch.bool, device=ids.device)
        counts = torch.bincount(ids[valid].flatten(), minlength=self.cfg.n_experts)
        self.loads[i] = self.loads.get(i, 0) + counts
        return ids, w

    # On the CPU the mixers' activations are recomputed in the backward: the torch chunked KDA
    # keeps a [B, H, C, C, K] decay tensor a chunk (~3 MB a token over the layers) and CPU
    # attention its score matrices, and a step of 8k tokens took 24 GB. Only each mixer's input
    # is kept.
    def _recomputed(self, mixer, i, x, lengths, valid, state):
        if self.kda_backend != "torch" or not torch.is_grad_enabled():
            return mixer(i, x, lengths, valid, state)

        def run(x):
            # training reads no cache or state back, so the writes go to a scratch state of this
            # call's own: in the shared one, the graph they carry closed a cycle through the
            # checkpoint that kept every step's activations alive (+4 GB a step)
            return mixer(i, x, lengths, valid, self.new_state(x.shape[0], state.capacity))

        return torch.utils.checkpoint.checkpoint(run, x, use_reentrant=False)

    def kda_prefill(self, i, x, lengths, valid, state):
        return self._recomputed(super().kda_prefill, i, x, lengths, valid, state)

    def mla_prefill(self, i, x, lengths, valid, state):
        return self._recomputed(super().mla_prefill, i, x, lengths, valid, state)

    def loss(self, tokens: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """(weighted mean next-token cross-entropy, the cross-entropy per position [B, T-1]):
        ``weights[:, t]`` weighs predicting ``tokens[:, t]``."""
        self.w = self._compute_weights()
        tokens, lengths, weights = (t.to(self.device) for t in (tokens, lengths, weights))
        B, T = tokens.shape
        self._valid = (torch.arange(T, device=self.device).view(1, T) < lengths.view(B, 1)).flatten()
        state = self.new_state(B, T)  # scratch: the prefill writes its caches here
        logits = self.prefill_forward(tokens, lengths, state, all_logits=True)
        self._valid = None
        ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1),
                             reduction="none")
        w = weights[:, 1:].reshape(-1)
        return (ce * w).sum() / w.sum().clamp_min(1e-6), ce.detach().view(B, T - 1)

    def export(self, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
        """The weights as the engine loads them: fp32 where weights.FP32_NAMES says, else ``dtype``."""
        return {n: (t.detach().float() if n.split(".")[-1] in FP32_NAMES else t.detach().to(dtype)).contiguous().cpu()
                for n, t in self.master.items()}
