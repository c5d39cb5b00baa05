"""Model spec for decoder-only transformers, with exact parameter counts.

Covers dense GPT-2/GPT-3/Llama-style models (MHA, GQA, MQA; GELU or SwiGLU MLP; LayerNorm
or RMSNorm; learned or rotary positions; optional biases), mixture-of-experts layers
(routed top-k experts, shared experts, dense-first layers, MoE layer frequency) and
DeepSeek's multi-head latent attention (MLA).

Parameter counts are exact sums over the weight matrices and vectors of the
implementation the catalog cites (e.g. Hugging Face `modeling_llama.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..limits import MAX_LAYERS

MLPKind = Literal["gelu", "swiglu"]  # ungated (two matrices) or gated (gate, up, down)
# The activation function as transformers names it (`activation_function` / `hidden_act`):
# what it keeps for backward depends on the ops its implementation runs
# (estimate/activations.py). None: one kernel keeping its input (F.gelu for a "gelu" MLP,
# F.silu for a gated one), as Megatron's fused GELU and SwiGLU run.
ActivationKind = Literal["gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "quick_gelu", "silu", "swish",
                         "relu", "relu2"]
# How a transformers MoE block runs its routed experts: "grouped" (transformers 5's default
# `grouped_mm`: tokens sorted by expert, one grouped GEMM, combined by a reshape and sum) or
# "eager" (a loop over the experts combined with `index_add_`). None: not stated.
ExpertsImpl = Literal["grouped", "eager"]
NormKind = Literal["layernorm", "rmsnorm"]
PositionKind = Literal["learned", "rotary", "none"]
# Where a layer's norms sit: "pre" (one before attention and one before the MLP: Llama), "post"
# (after each block, before its residual add: OLMo 2) or "sandwich" (both: Gemma 2/3). One norm
# feeding attention and MLP in parallel (GPT-J, Phi, Cohere) is `shared_norm`.
NormPosition = Literal["pre", "post", "sandwich"]
NORMS_PER_LAYER = {"pre": 2, "post": 2, "sandwich": 4}
# An attention layer's mask (transformers' `layer_types`).
LayerType = Literal["full_attention", "sliding_attention"]

RouterScore = Literal["softmax", "sigmoid"]


class RopeScaling(BaseModel):
    """Rotary frequencies stretched for long context: Llama 3.1's "llama3" rule (factor,
    low/high frequency factors) or YaRN (factor, beta_fast/slow, mscale), from the original
    context length (Hugging Face `rope_scaling`); or transformers' "linear" (Gemma 3), "dynamic"
    (InternLM3) and "longrope" (Phi-3.5) rules, kept by name. Scaling changes the rotation's
    frequencies only: no shape, no memory, no time (what an export must repeat)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["llama3", "yarn", "linear", "dynamic", "longrope"]
    factor: float | None = Field(default=None, gt=0, le=10_000)
    original_max_position: int | None = Field(default=None, ge=1, le=100_000_000)
    low_freq_factor: float | None = Field(default=None, gt=0)  # llama3
    high_freq_factor: float | None = Field(default=None, gt=0)  # llama3
    beta_fast: float | None = Field(default=None, gt=0)  # yarn
    beta_slow: float | None = Field(default=None, gt=0)  # yarn
    mscale: float | None = Field(default=None, ge=0)  # yarn
    mscale_all_dim: float | None = Field(default=None, ge=0)  # yarn


# Linear layers that LoRA can target, by the names Hugging Face PEFT users write.
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclass(frozen=True)
class Linear:
    """One weight matrix of a layer: y = x W, W of shape (fan_in, fan_out).

    `tp` says how tensor parallelism splits it: "col" (output dim), "row" (input dim),
    "kv" (column-split over KV heads, replicated when tp > kv_heads) or "none" (replicated).
    """

    name: str
    fan_in: int
    fan_out: int
    tp: Literal["col", "row", "kv", "none"]
    bias: bool = False
    expert: bool = False  # routed-expert weight (split by expert parallelism)
    count: int = 1  # identical copies (e.g. one per routed expert)

    @cached_property
    def params(self) -> int:
        return self.count * (self.fan_in * self.fan_out + (self.fan_out if self.bias else 0))


class ModelSpec(BaseModel):
    """A decoder-only transformer. Sizes are the published configuration's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    source: str = Field(min_length=1, description="where the numbers come from")
    family: str = ""
    published_params: float | None = Field(default=None, gt=0)
    published_active_params: float | None = Field(default=None, gt=0)

    layers: int = Field(ge=1, le=MAX_LAYERS)
    hidden: int = Field(ge=1, le=1_000_000)
    heads: int = Field(ge=1, le=100_000)
    kv_heads: int | None = Field(default=None, ge=1, le=100_000)
    head_dim: int | None = Field(default=None, ge=1, le=100_000)
    ffn: int = Field(ge=1, le=10_000_000)
    mlp: MLPKind = "swiglu"
    activation: ActivationKind | None = None  # None: a fused single-kernel GELU / SiLU
    vocab: int = Field(ge=1, le=100_000_000)
    tied_embeddings: bool = False
    norm: NormKind = "rmsnorm"
    position: PositionKind = "rotary"
    max_position: int = Field(default=4096, ge=1, le=100_000_000)
    qkv_bias: bool = False
    bias: bool = False  # biases on the attention output and MLP linears
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)
    fused_qkv: bool = False  # one QKV projection (GPT-2 c_attn, GPT-NeoX, Megatron) vs q/k/v
    parallel_residual: bool = False  # attention and MLP read the same input (GPT-NeoX, GPT-J)
    # ---- partial rotary, shared parallel norm, per-family biases ----------------------------
    # Share of each head's width that RoPE rotates (transformers' `partial_rotary_factor`,
    # GPT-NeoX's `rotary_pct`, GPT-J's `rotary_dim` / head_dim): the rest passes unrotated.
    rotary_fraction: float = Field(default=1.0, gt=0, le=1)
    # With a parallel residual, one norm feeds both attention and MLP (GPT-J's ln_1, Phi's
    # input_layernorm, Falcon-7B's): one norm's weights, one normalised input kept for both.
    shared_norm: bool = False
    # RoPE that concatenates its rotated and passed-through parts (the partial-rotary
    # `apply_rotary_pos_emb` of transformers' Phi, Phi-3, StableLM, GLM, GPT-NeoX, whatever the
    # share rotated): q comes out heads-major (estimate/activations.py `_heads_major_output`).
    rope_concat: bool = False
    # RoPE that rotates adjacent pairs (x[2i], x[2i+1]: GPT-J's rotate_every_two, GLM's
    # rotate_half) rather than the two halves of the rotated width (Llama, GPT-NeoX): the same
    # FLOPs and bytes, another model; exports name it (Megatron-LM `--rotary-interleaved`).
    rope_interleaved: bool = False
    # K/V heads broadcast to the query heads inside SDPA, not repeated (transformers' Falcon with
    # `multi_query`): `attention_kernel`.
    kv_broadcast: bool = False
    mlp_bias: bool | None = None  # biases on the MLP linears; None: as `bias`
    head_bias: bool = False  # a bias on the output head (Phi, GPT-J, PhiMoE's lm_head_bias)

    # Norms, attention masks and soft-capping (Gemma, OLMo, Cohere, gpt-oss; `norm_features`).
    norm_position: NormPosition = "pre"
    norm_weight: bool = True  # the norms carry a weight (OLMo's LayerNorm has none)
    norm_bias: bool = True  # a LayerNorm's bias (Cohere's LayerNorm has none)
    # q/k norms: over each head with one weight for all heads (Qwen3, Gemma 3), over all heads (OLMo 2),
    # or over each head with a weight per head (Cohere's use_qk_norm)
    qk_norm_scope: Literal["head", "all", "per_head"] = "head"
    clip_qkv: float | None = Field(default=None, gt=0)  # q, k, v clamped in place to ±clip (OLMo)
    attn_softcap: float | None = Field(default=None, gt=0)  # cap·tanh(scores/cap) (Gemma 2)
    final_softcap: float | None = Field(default=None, gt=0)  # cap·tanh(logits/cap) (Gemma 2)
    sliding_window: int | None = Field(default=None, ge=1, le=100_000_000)  # keys a sliding layer's query sees
    layer_types: tuple[LayerType, ...] | None = None  # per layer; None: all sliding when sliding_window is set
    attention_sinks: bool = False  # a learned per-head logit in every softmax (gpt-oss)
    swiglu_limit: float | None = Field(default=None, gt=0)  # clamped SwiGLU (gpt-oss): gate <= l, |up| <= l
    expert_bias: bool = False  # biases on the routed experts' linears and the router (gpt-oss)
    mlp_only_layers: tuple[int, ...] = ()  # layers with a dense MLP in an MoE model (Qwen-MoE)

    # Mixture of experts.
    experts: int = Field(default=0, ge=0, le=100_000)
    top_k: int = Field(default=0, ge=0, le=100_000)
    expert_ffn: int | None = Field(default=None, ge=1, le=10_000_000)
    shared_experts: int = Field(default=0, ge=0, le=1000)
    shared_expert_ffn: int | None = Field(default=None, ge=1, le=10_000_000)
    shared_expert_gate: bool = False  # sigmoid gate on the shared expert (Qwen-MoE)
    first_dense_layers: int = Field(default=0, ge=0)
    moe_layer_freq: int = Field(default=1, ge=1)
    capacity_factor: float | None = Field(default=None, gt=0, le=1000)
    router_bias: bool = False  # per-expert score-correction bias (DeepSeek-V3)
    experts_impl: ExpertsImpl | None = None  # None: the planner's default (activations.DEFAULT_EXPERTS_IMPL)

    # Multi-head latent attention (DeepSeek-V2/V3).
    q_lora_rank: int | None = Field(default=None, ge=1)
    kv_lora_rank: int | None = Field(default=None, ge=1)
    qk_rope_head_dim: int | None = Field(default=None, ge=0)
    qk_nope_head_dim: int | None = Field(default=None, ge=0)
    v_head_dim: int | None = Field(default=None, ge=1)

    # Rotary positions, norms and routing as the source configures them (what a framework's
    # config must repeat for the exported model to be the planned one). None: not stated.
    rope_theta: float | None = Field(default=None, gt=0, le=1e12)
    rope_scaling: RopeScaling | None = None
    norm_eps: float | None = Field(default=None, gt=0, lt=1)
    router_score: RouterScore = "softmax"  # the expert-score function (DeepSeek-V3: sigmoid)
    router_norm_topk: bool = True  # the top-k weights renormalised to sum to 1 (Qwen1.5-MoE: not)
    router_scale: float = Field(default=1.0, gt=0, le=1000)  # DeepSeek-V3 routed_scaling_factor
    router_groups: int | None = Field(default=None, ge=1)  # device-limited routing: expert groups
    router_group_topk: int | None = Field(default=None, ge=1)  # ... and the groups each token picks

    @field_validator("layers", mode="before")
    @classmethod
    def _planned_depth(cls, v):
        # a plan's and a search's work grow with the layers (trainplan.limits): the limit in words
        if isinstance(v, int) and not isinstance(v, bool) and v > MAX_LAYERS:
            raise ValueError(f"at most {MAX_LAYERS:,} layers are planned (the deepest published models have "
                             f"about 128); got {v:,}")
        return v

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        kv = self.n_kv_heads
        if self.heads % kv != 0:
            raise ValueError(
                f"kv_heads ({kv}) must divide heads ({self.heads}) for grouped-query attention"
            )
        if self.head_dim is None and not self.is_mla and self.hidden % self.heads != 0:
            raise ValueError(
                f"heads ({self.heads}) must divide hidden ({self.hidden}) unless head_dim is given"
            )
        if self.experts:
            if not 1 <= self.top_k <= self.experts:
                raise ValueError(f"top_k must be between 1 and experts ({self.experts})")
            if self.first_dense_layers >= self.layers:
                raise ValueError("first_dense_layers must be below layers")
        elif self.top_k or self.shared_experts:
            raise ValueError("top_k and shared_experts need experts > 0")
        if self.shared_norm and not self.parallel_residual:
            raise ValueError("shared_norm needs parallel_residual (one norm feeding attention and MLP)")
        if self.rotary_fraction < 1 and self.position != "rotary":
            raise ValueError("rotary_fraction below 1 needs rotary positions")
        if self.rope_interleaved and self.position != "rotary":
            raise ValueError("rope_interleaved needs rotary positions")
        if self.rotary_fraction < 1 and self.rotary_dim % 2:
            raise ValueError(f"rotary_fraction x head width must be an even number of dimensions "
                             f"(got {self.rotary_fraction} x {self.dim_head})")
        if self.layer_types is not None and len(self.layer_types) != self.layers:
            raise ValueError(f"layer_types must name one attention type per layer ({self.layers}); "
                             f"got {len(self.layer_types)}")
        if self.sliding_layers and self.sliding_window is None:
            raise ValueError("sliding_attention layers need sliding_window")
        if any(not 0 <= i < self.layers for i in self.mlp_only_layers):
            raise ValueError(f"mlp_only_layers must be layer indices from 0 to {self.layers - 1}")
        if self.is_mla and (self.qk_rope_head_dim is None or self.qk_nope_head_dim is None
                            or self.v_head_dim is None):
            raise ValueError("MLA needs qk_rope_head_dim, qk_nope_head_dim and v_head_dim")
        return self

    # ---- derived shapes -------------------------------------------------------------
    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def q_dim(self) -> int:
        """Width of the query projection (all heads)."""
        if self.is_mla:
            return self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.heads * self.dim_head

    @property
    def kv_dim(self) -> int:
        """Width of the key (= value) projection (all KV heads)."""
        if self.is_mla:
            return self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.n_kv_heads * self.dim_head

    @property
    def v_dim(self) -> int:
        return self.heads * self.v_head_dim if self.is_mla else self.kv_dim

    @property
    def rotary_dim(self) -> int:
        """The width RoPE rotates in each head (MLA: its rotary part; 0 without RoPE)."""
        if self.position != "rotary":
            return 0
        if self.is_mla:
            return self.qk_rope_head_dim
        return int(self.dim_head * self.rotary_fraction)

    def attention_kernel(self, attention: str) -> str:
        """The attention the model runs when `attention` is asked for: SDPA falls back to its
        math kernel (materialised scores, priced as eager) where K/V heads are broadcast to more
        query heads, which PyTorch's fused kernels refuse (they need one head count unless GQA
        is enabled; torch 2.x sdp_utils, measured with transformers' Falcon on the CPU)."""
        if attention == "sdpa" and self.kv_broadcast and self.n_kv_heads < self.heads:
            return "eager"
        return attention

    @property
    def attn_out_dim(self) -> int:
        """Width of the attention output fed to the output projection."""
        return self.heads * self.v_head_dim if self.is_mla else self.q_dim

    @cached_property
    def fields_hash(self) -> int:
        """pydantic's hash of a frozen model (its fields' values), computed once: the
        estimators' caches look the spec up several times per evaluation."""
        return hash(tuple(self.__dict__[name] for name in type(self).model_fields))

    def __hash__(self) -> int:
        return self.fields_hash

    def model_copy(self, *, update=None, deep: bool = False):
        """pydantic's copy; with `update`, the values cached from the fields (`fields_hash` and
        the other cached properties) are dropped, to be derived again from the copy's own."""
        copy = super().model_copy(update=update, deep=deep)
        if update:
            for key in [k for k in copy.__dict__ if k not in type(self).model_fields]:
                del copy.__dict__[key]
        return copy

    @cached_property
    def moe_layer_flags(self) -> tuple[bool, ...]:
        """is_moe_layer for every layer, in order."""
        return tuple(self.is_moe_layer(i) for i in range(self.layers))

    @cached_property
    def n_moe_layers(self) -> int:
        return sum(self.moe_layer_flags)

    def first_layer(self, moe: bool) -> int | None:
        """Index of the first MoE (moe=True) or dense layer; None when the model has none."""
        return next((i for i, flag in enumerate(self.moe_layer_flags) if flag == moe), None)

    def is_moe_layer(self, index: int) -> bool:
        """DeepSeek rule (modeling_deepseek.py): dense below first_dense_layers, then MoE
        on every layer whose index is a multiple of moe_layer_freq; Qwen-MoE's `mlp_only_layers` dense."""
        if not self.is_moe or index < self.first_dense_layers or index in self.mlp_only_layers:
            return False
        return index % self.moe_layer_freq == 0

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2

    # ---- weight inventory ----------------------------------------------------------
    def attention_linears(self) -> list[Linear]:
        h = self.hidden
        if self.is_mla:
            nope, rope, vd = self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
            a = self.heads
            out: list[Linear] = []
            if self.q_lora_rank:
                out += [Linear("q_a", h, self.q_lora_rank, "none"),
                        Linear("q", self.q_lora_rank, a * (nope + rope), "col")]
            else:
                out.append(Linear("q", h, a * (nope + rope), "col"))
            out += [Linear("kv_a", h, self.kv_lora_rank + rope, "none"),
                    Linear("kv_b", self.kv_lora_rank, a * (nope + vd), "col"),
                    Linear("o", a * vd, h, "row", bias=self.bias)]
            return out
        return [
            Linear("q", h, self.q_dim, "col", bias=self.qkv_bias),
            Linear("k", h, self.kv_dim, "kv", bias=self.qkv_bias),
            Linear("v", h, self.kv_dim, "kv", bias=self.qkv_bias),
            Linear("o", self.q_dim, h, "row", bias=self.bias),
        ]

    def mlp_linears(self, ffn: int, *, expert: bool = False, count: int = 1) -> list[Linear]:
        h = self.hidden
        bias = (self.bias if self.mlp_bias is None else self.mlp_bias) or (expert and self.expert_bias)
        up = [Linear("up", h, ffn, "col", bias=bias, expert=expert, count=count)]
        if self.mlp == "swiglu":
            up.insert(0, Linear("gate", h, ffn, "col", bias=bias, expert=expert, count=count))
        return up + [Linear("down", ffn, h, "row", bias=bias, expert=expert, count=count)]

    @property
    def shared_ffn_total(self) -> int:
        """The total width of an MoE layer's shared experts (0 without)."""
        return (self.shared_expert_ffn or self.expert_ffn or self.ffn) * self.shared_experts

    def layer_linears(self, index: int) -> list[Linear]:
        out = self.attention_linears()
        if self.is_moe_layer(index):
            out += self.mlp_linears(self.expert_ffn or self.ffn, expert=True, count=self.experts)
            if self.shared_experts:
                out += self.mlp_linears(self.shared_ffn_total)
            out.append(Linear("router", self.hidden, self.experts, "none", bias=self.expert_bias))
            if self.shared_expert_gate:
                out.append(Linear("shared_gate", self.hidden, 1, "none"))
        else:
            out += self.mlp_linears(self.ffn)
        return out

    def layer_vector_params(self, index: int) -> int:
        """Norm weights/biases and other per-layer vectors not in `layer_linears`."""
        # pre-attention and pre-MLP norms, one shared (parallel residual), or Gemma's four
        n = (1 if self.shared_norm else NORMS_PER_LAYER[self.norm_position]) * self.norm_params(self.hidden)
        if self.qk_norm:
            n += self.norm_params(2 * self.dim_head if self.qk_norm_scope == "head" else self.q_dim + self.kv_dim)
        if self.attention_sinks:
            n += self.heads
        if self.is_mla:
            n += self.kv_lora_rank + (self.q_lora_rank or 0)  # latent RMSNorms
        # (DeepSeek-V3's per-expert score-correction bias, `router_bias`, is a buffer moved by its
        # balancing rule, not a trained parameter: transformers' e_score_correction_bias is an
        # nn.Buffer, Megatron-Core's expert_bias a registered buffer; E floats, left out)
        return n

    def norm_params(self, width: int) -> int:
        """The weight (and a LayerNorm's bias) of a norm over `width` elements."""
        if not self.norm_weight:
            return 0
        return width * (2 if self.norm == "layernorm" and self.norm_bias else 1)

    # ---- norms, attention masks and soft-capping ---------------------------------------
    @cached_property
    def sliding_layers(self) -> int:
        """How many layers attend through a sliding window (transformers' `layer_types`; every
        layer when only `sliding_window` is given, as Mistral's)."""
        if self.layer_types is None:
            return self.layers if self.sliding_window is not None else 0
        return sum(t == "sliding_attention" for t in self.layer_types)

    @property
    def sliding_share(self) -> float:
        return self.sliding_layers / self.layers

    def layer_pattern(self, layers: int) -> dict:
        """`layer_types` and `mlp_only_layers` for the same model at `layers` layers (a scaled-down
        copy): as many sliding and dense-MLP layers in proportion, at least one of each kind the
        model has, and at least one full-attention and one MoE layer where it has them."""
        out: dict = {}
        if self.layer_types is not None:
            sliding = round(self.sliding_share * layers)
            if self.sliding_layers:
                sliding = max(1, sliding)
            if self.sliding_layers < self.layers and layers > 1:
                sliding = min(sliding, layers - 1)
            # full-attention layers spread evenly, each after its sliding ones (Gemma 2/3, gpt-oss)
            full = layers - sliding
            out["layer_types"] = tuple("full_attention" if (i + 1) * full // layers > i * full // layers
                                       else "sliding_attention" for i in range(layers))
        if self.mlp_only_layers:
            dense = max(1, round(len(self.mlp_only_layers) / self.layers * layers))
            out["mlp_only_layers"] = tuple(range(min(dense, layers - 1)))
        return out

    # ---- parameter counts ----------------------------------------------------------
    def layer_params(self, index: int) -> int:
        return sum(lin.params for lin in self.layer_linears(index)) + self.layer_vector_params(index)

    def layer_active_params(self, index: int) -> int:
        total = self.layer_params(index)
        if not self.is_moe_layer(index):
            return total
        routed = sum(lin.params for lin in self.layer_linears(index) if lin.expert)
        return total - routed + routed * self.top_k // self.experts

    @property
    def embedding_params(self) -> int:
        pos = self.max_position * self.hidden if self.position == "learned" else 0
        return self.vocab * self.hidden + pos

    @property
    def head_params(self) -> int:
        """Final norm plus the output projection (zero extra when tied)."""
        return (self.final_norm_params + (0 if self.tied_embeddings else self.vocab * self.hidden)
                + (self.vocab if self.head_bias else 0))

    @property
    def final_norm_params(self) -> int:
        return self.norm_params(self.hidden)

    @cached_property
    def params(self) -> int:
        return (self.embedding_params + self.head_params
                + sum(self.layer_params(i) for i in range(self.layers)))

    @cached_property
    def active_params(self) -> int:
        return (self.embedding_params + self.head_params
                + sum(self.layer_active_params(i) for i in range(self.layers)))

    @property
    def non_embedding_params(self) -> int:
        return self.params - self.embedding_params

    def summary(self) -> dict:
        return {"name": self.name, "params": self.params, "active_params": self.active_params}
