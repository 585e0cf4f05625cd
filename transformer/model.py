"""The Transformer of "Attention Is All You Need" (§3): encoder-decoder built only from attention.

Shape legend: B batch, S source length, T target length, D d_model, H heads, V vocabulary,
d_k / d_v per-head sizes. Masks are boolean with True = "may attend" (the convention of
``torch.nn.functional.scaled_dot_product_attention``), built in ``padding_mask``; ``attention`` makes its own
causal one, and a decoding's cache holds its source mask additive (0 / -inf, ``init_cache``).

Token ids: PAD = 0 doubles as the decoder's start symbol. Its embedding is zero at lookup, so the
first decoder input is the zero vector plus PE(0), as in the authors' code (IMPLEMENTATION-NOTES A5).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .errors import UserError, stops_held
from .tokenizer import PAD_ID


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout (§5.4): zero each element with probability p, scale the rest by 1/(1-p).

    On CPU the mask comes from 16-bit slices of 64-bit random words (p quantised to 1/65536):
    ``bernoulli_`` draws one random number per element, this one per four elements, and random
    numbers are a dropout mask's whole cost. Other devices use ``F.dropout``, and so does a compiled
    model (torch.compile cannot trace these words: each layer would break the graph and compile again).
    """
    if not training or p == 0.0:
        return x
    dropped = round(p * 65536)  # of 65536 slice values; P(keep) = 1 - dropped / 65536
    # a p within 2^-17 of 1 rounds to all 65536, a threshold past int16's range: every element was kept, scaled by
    # 1/(1-p)
    if x.device.type != "cpu" or torch.compiler.is_compiling() or dropped >= 65536:
        return F.dropout(x, p, True)
    n = x.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(torch.iinfo(torch.int64).min, None)
    keep = words.view(torch.int16)[:n].view(x.shape) >= dropped - 32768
    # scaled by the quantised p's 1/(1-p): the expectation stays x (by p's own, it drifted: +4% at p = 0.999)
    return x * keep.to(x.dtype).mul_(65536 / (65536 - dropped))


class Dropout(nn.Module):
    """``nn.Dropout`` with the fast CPU mask of ``dropout``."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


ONEDNN_MIN_MACS = 1 << 19  # products smaller than this stay on torch's default BLAS (lower per-call cost)
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
# the float weights ``linear`` and ``pack_for_inference`` take there: bf16 only where oneDNN has bf16 kernels for
# this CPU (AVX512BW/VL/DQ or AVX-NE-CONVERT); on an AVX2 processor it has none (every bf16 product there failed),
# and bf16 goes through torch's own kernels
ONEDNN_DTYPES = (torch.float32,) + ((torch.bfloat16,) if _ONEDNN and torch.ops.mkldnn._is_mkldnn_bf16_supported()
                                    else ())


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, relu: bool = False) -> Tensor:
    """x Wᵀ + b (then max(0, ·) with ``relu``). Without gradients on a CPU, products of at least
    ``ONEDNN_MIN_MACS`` multiply-adds go through oneDNN (PyTorch's own mkldnn operator, the library
    CTranslate2 picks on this CPU) instead of the default BLAS, whose fp32 kernels are much slower on
    AMD processors; tiny products stay on the BLAS, whose per-call cost is lower. A weight that
    ``pack_for_inference`` reordered into oneDNN's blocked layout is read from that copy. fp32 and bf16
    (a model decoding in bf16: ``translator.Translator``) alike. The measurements behind these choices:
    benchmarks/linear_kernels.py. Gradients always take ``F.linear``."""
    if (not torch.is_grad_enabled() and x.device.type == "cpu" and x.dtype in ONEDNN_DTYPES and _ONEDNN
            and x.numel() * weight.size(0) >= ONEDNN_MIN_MACS):
        w = getattr(weight, "_onednn", weight)
        return torch.ops.mkldnn._linear_pointwise(x, w, bias, "relu" if relu else "none", [], "")
    y = F.linear(x, weight, bias)
    return F.relu(y) if relu else y


def pack_for_inference(model: nn.Module) -> None:
    """Each float linear weight of ``model`` (and a tied output projection's embedding) gets a copy in
    oneDNN's blocked layout that ``linear`` reads: the reorder is paid once instead of at every call.
    Only for a model that is decoded and never trained again, as ``Translator`` loads it: the copies
    would not follow an update of the weights (a model in training validates without them)."""
    if not _ONEDNN:
        return
    weights = [m.weight for m in model.modules() if type(m) is nn.Linear and m.weight.dtype in ONEDNN_DTYPES
               and m.weight.device.type == "cpu"]
    weights += [m.output_weight for m in model.modules()  # tied: the embedding is the projection
                if isinstance(m, Transformer) and "output_proj" not in m._modules
                and m.output_weight.dtype in ONEDNN_DTYPES and m.output_weight.device.type == "cpu"]
    for w in weights:
        pack(w)


def pack(weight: Tensor) -> Tensor:
    """``weight`` with a copy in oneDNN's blocked layout beside it, which ``linear`` reads."""
    weight._onednn = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
    return weight


def apply(layer: nn.Module, x: Tensor, relu: bool = False) -> Tensor:
    """A projection of the model applied to x: ``linear`` for a float linear layer at inference, the
    layer's own forward otherwise (training, where hooks may watch it; an int8 copy's quantized layer)."""
    if type(layer) is nn.Linear and not torch.is_grad_enabled():  # with gradients: the module, hooks and all
        return linear(x, layer.weight, layer.bias, relu)
    return F.relu(layer(x)) if relu else layer(x)


# oneDNN keeps a compiled kernel for every input shape it has seen (1,024 by default); a server sees
# many batch shapes, and the cache grew its memory by tens of MiB (tests/reliability/test_server_abuse.py).
# A decoding batch needs a handful: 32 keeps them. Read when oneDNN makes its first kernel, so set here.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "32")


def joined(projections: tuple[nn.Module | FloatWeights, ...]) -> tuple[Tensor, Tensor | None] | None:
    """Several projections' weights (and biases) side by side, to run them as one product; None when
    they are not all plain linear layers or float weights (an int8 copy's layers hold none). One
    projection's are its own tensors, not copies; several packed ones (``pack_for_inference``) give a
    packed weight, so that oneDNN does not reorder it at every product."""
    if not all(type(m) in (nn.Linear, FloatWeights) for m in projections):
        return None
    if len(projections) == 1:
        return projections[0].weight, projections[0].bias
    bias = None if projections[0].bias is None else torch.cat([m.bias for m in projections])
    weight = torch.cat([m.weight for m in projections])
    return (pack(weight) if all(hasattr(m.weight, "_onednn") for m in projections) else weight), bias


class FloatWeights(NamedTuple):
    """A linear layer's float weight and bias, kept beside its int8 copy (``translator.quantize_int8``)."""

    weight: Tensor
    bias: Tensor | None


class Int8Projection(NamedTuple):
    """An int8 copy's projection(s) in a decoding step (``translator.quantize_int8``): the quantized
    layers, and their float weights side by side for products too small for int8 to pay."""

    layers: nn.Module | list[nn.Module]
    floats: tuple[Tensor, Tensor | None]


Projection = tuple[Tensor, Tensor | None] | list[nn.Module] | nn.Module | Int8Projection


def prepared(projections: tuple[nn.Module, ...]) -> Projection:
    """Projections as a decoding step reads them (``project``): a float layer's (weight, bias), several
    float layers' weights side by side (one product), or the layers themselves (an int8 copy's, with
    the float weights it kept, when it kept them)."""
    if (weights := joined(projections)) is not None:
        return weights
    layers = projections[0] if len(projections) == 1 else list(projections)
    if all(hasattr(m, "float_weights") for m in projections):
        return Int8Projection(layers, joined(tuple(m.float_weights for m in projections)))
    return layers


def project(p: Projection, x: Tensor, relu: bool = False) -> Tensor:
    """x through a ``prepared`` projection: one product for weights, the layers' outputs side by side
    for a list of layers. An int8 projection takes its float weights for products of fewer than
    ``ONEDNN_MIN_MACS`` multiply-adds (a step at batch 1): below that, quantizing the input at every
    call costs more than int8's product saves (benchmarks/linear_kernels.py measures both)."""
    if type(p) is Int8Projection:
        if x.size(0) * p.floats[0].numel() < ONEDNN_MIN_MACS:
            return linear(x, p.floats[0], p.floats[1], relu)
        p = p.layers
    if type(p) is tuple:
        return linear(x, p[0], p[1], relu)
    if type(p) is list:
        return torch.cat([apply(m, x) for m in p], -1)
    return apply(p, x, relu)


def padding_mask(tokens: Tensor) -> Tensor:
    """[B, S] ids -> [B, 1, 1, S] bool, True where a key is a real token (broadcast over heads, queries)."""
    return (tokens != PAD_ID)[:, None, None, :]


LARGE_SCORES = 2**26  # elements of QKᵀ (256 MiB in fp32) past which the CPU takes SDPA's blockwise kernel


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False,
              dropout_p: float = 0.0, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention (§3.2.1, eq. 1): softmax(QKᵀ/√d_k)V.

    q [B, H, Tq, d_k], k [B, H, Tk, d_k], v [B, H, Tk, d_v] -> [B, H, Tq, d_v]. Masked logits are
    set to -inf before the softmax: ``mask`` is True where a key may be attended to, or a float mask
    added to the logits (0 or -inf; a decoding cache keeps its source mask so, made once per batch
    instead of by SDPA at every call). On accelerators the fast path is PyTorch's fused SDPA (flash /
    memory-efficient kernels). The explicit path computes eq. (1) as written and also returns the
    weights [B, H, Tq, Tk] (figures and tests need them); on CPU it is the faster one at translation
    lengths (a Multi30k training step is faster through it than through SDPA's CPU kernel; they tie
    near 60 tokens), so CPU takes it, except for few queries in all (batch × heads × queries <= 64: a
    decoding step's self-attention, and the cross-attention of a sentence's beams, in small batches),
    where SDPA's one call beats the explicit path's five (benchmarks/linear_kernels.py measures both), and
    where the scores would be large (``LARGE_SCORES``: a line of tens of thousands of pieces asked for tens of
    gigabytes at once, and the kernel killed the process without a word): SDPA's CPU kernel works in blocks.
    """
    large = q.shape[:3].numel() * k.size(-2) > LARGE_SCORES
    if not need_weights and (q.device.type != "cpu" or q.shape[:3].numel() <= 64 or large):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
        return out, None
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # eq. (1): QKᵀ/√d_k
    if is_causal:
        tq, tk = scores.shape[-2:]
        causal = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
        mask = causal if mask is None else mask & causal
    if mask is not None:
        scores = scores + mask if mask.is_floating_point() else scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return dropout(weights, dropout_p, dropout_p > 0.0) @ v, weights


class MultiHeadAttention(nn.Module):
    """Multi-head attention (§3.2.2): Concat(head_1..head_h) W^O, head_i = Attention(QW_i^Q, KW_i^K, VW_i^V).

    d_k and d_v are free parameters (Table 3 rows A and B change them independently of d_model / h).
    """

    def __init__(self, d_model: int, n_heads: int, d_k: int, d_v: int, p_drop_attn: float, bias: bool):
        super().__init__()
        self.n_heads, self.d_k, self.d_v, self.p_drop_attn = n_heads, d_k, d_v, p_drop_attn
        self.q_proj = nn.Linear(d_model, n_heads * d_k, bias=bias)
        self.k_proj = nn.Linear(d_model, n_heads * d_k, bias=bias)
        self.v_proj = nn.Linear(d_model, n_heads * d_v, bias=bias)
        self.out_proj = nn.Linear(n_heads * d_v, d_model, bias=bias)
        self.record: list[Tensor] | None = None  # set by record_attention()

    def split_heads(self, x: Tensor, d: int) -> Tensor:
        return x.unflatten(-1, (self.n_heads, d)).transpose(1, 2)  # [B, L, H*d] -> [B, H, L, d]

    def _project(self, x: Tensor, projections: tuple[nn.Linear, ...], dims: tuple[int, ...]) -> list[Tensor]:
        """x through several projections, each split into heads.

        With gradients (training), the projections run as one matmul with their weights side by
        side: one larger product and one backward instead of two or three small ones. Without gradients
        (validation, the encoder and the memory's keys and values when decoding starts) they run one by
        one: joining the weights would copy them at every call, and an int8 copy's encoder layers
        (``translator.quantize_int8``) hold no float weights to join. Decoding steps read weights joined
        once a batch (``StepWeights``).
        """
        if torch.is_grad_enabled() and (weights := joined(projections)) is not None:
            outputs = F.linear(x, *weights).split([m.out_features for m in projections], -1)
        else:
            outputs = [apply(m, x) for m in projections]
        return [self.split_heads(y, d) for y, d in zip(outputs, dims)]

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of x, split into heads: [B, H, L, d_k], [B, H, L, d_v]."""
        k, v = self._project(x, (self.k_proj, self.v_proj), (self.d_k, self.d_v))
        return k, v

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of x (self-attention), split into heads."""
        q, k, v = self._project(x, (self.q_proj, self.k_proj, self.v_proj), (self.d_k, self.d_k, self.d_v))
        return q, k, v

    def forward(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        """x [B, Tq, D] queries; k, v already projected and split (``project_kv``) -> [B, Tq, D]."""
        return self.attend(self.split_heads(apply(self.q_proj, x), self.d_k), k, v, mask, is_causal)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
               is_causal: bool = False) -> Tensor:
        """q, k, v projected and split into heads -> the heads' outputs concatenated and projected, [B, Tq, D]."""
        p = self.p_drop_attn if self.training else 0.0
        out, weights = attention(q, k, v, mask, is_causal, p, need_weights=self.record is not None)
        if self.record is not None:
            self.record.append(weights.detach().float())  # figures and alignments read fp32 (a bf16 model too)
        return apply(self.out_proj, out.transpose(1, 2).flatten(2))  # [B, H, Tq, d_v] -> [B, Tq, H*d_v] -> [B, Tq, D]


class FeedForward(nn.Module):
    """Position-wise feed-forward network (§3.3, eq. 2): FFN(x) = max(0, xW1 + b1)W2 + b2."""

    def __init__(self, d_model: int, d_ff: int, p_drop_relu: float):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff)
        self.w2 = nn.Linear(d_ff, d_model)
        self.p_drop_relu = p_drop_relu

    def forward(self, x: Tensor) -> Tensor:
        return apply(self.w2, dropout(apply(self.w1, x, relu=True), self.p_drop_relu, self.training))  # eq. (2)


def residual(x: Tensor, norm: nn.LayerNorm, drop: Dropout, pre: bool,
             sublayer: Callable[[Tensor], Tensor]) -> Tensor:
    """A sub-layer with its residual connection: post-norm LayerNorm(x + Dropout(Sublayer(x))) (§3.1,
    §5.4); or pre-norm x + Dropout(Sublayer(LayerNorm(x))) when ``pre`` (DEVIATION(§3.1): model.norm =
    "pre", the authors' later default, A0).

    A post-norm stream in bf16 or fp16 (``autocast_stream``) stays so: LayerNorm takes its statistics in
    fp32 and returns the stream's dtype, its gain and bias read in that dtype (a GPU's kernel takes no
    mixed dtypes), where autocast would return fp32 on a GPU."""
    if pre:
        return x + drop(sublayer(norm(x)))
    s = x + drop(sublayer(x))
    if s.dtype == torch.float32:
        return norm(s)
    with torch.autocast(s.device.type, enabled=False):
        return F.layer_norm(s, norm.normalized_shape, norm.weight.to(s.dtype), norm.bias.to(s.dtype), norm.eps)


def autocast_stream(x: Tensor, pre: bool) -> Tensor:
    """The embeddings' sum as the post-norm residual stream under autocast: in autocast's dtype (bf16), as
    Megatron-LM keeps it by default, not fp32. Each sub-layer's products take bf16 anyway: an fp32
    stream had every LayerNorm output cast to bf16 for the next products and every gradient cast back
    (the largest copies left in a GPU profile of base and big), and LayerNorm moved twice the bytes.
    Post-norm only: its stream is normalised after every sub-layer, where pre-norm's sums grow un-
    normalised through the stack and keep fp32."""
    if not pre and torch.is_autocast_enabled(x.device.type):
        return x.to(torch.get_autocast_dtype(x.device.type))
    return x


class EncoderLayer(nn.Module):
    """§3.1: self-attention then FFN, each wrapped as LayerNorm(x + Dropout(Sublayer(x))) (§5.4), or
    pre-norm (``residual``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d_k, d_v = cfg.head_dims
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, d_k, d_v, cfg.p_drop_attn, cfg.bias)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.p_drop_relu)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.drop = Dropout(cfg.p_drop)
        self.pre = cfg.norm == "pre"

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = residual(x, self.norm1, self.drop, self.pre,
                     lambda h: self.self_attn.attend(*self.self_attn.project_qkv(h), mask=src_mask))
        return residual(x, self.norm2, self.drop, self.pre, self.ffn)


class StepWeights(NamedTuple):
    """A decoder layer's weights as its incremental step reads them, gathered once per batch: a step
    then reads tuple fields instead of going through modules (at batch 1 the calls between the small
    products are most of a step's time). Projections are ``prepared``: the self-attention's Q/K/V
    side by side, one product."""

    qkv: Projection
    self_out: Projection
    cross_q: Projection
    cross_out: Projection
    w1: Projection
    w2: Projection
    norms: tuple[tuple[Tensor, Tensor], ...]  # (gain, bias) of norm1, norm2, norm3
    eps: float
    heads: int
    d_k: int
    d_v: int
    pre: bool  # pre-norm (model.norm = "pre")


@dataclass
class DecoderCache:
    """Incremental-decoding state of n sentences with ``beam`` rows each, sentence-major (torchtune's
    KVCache: a small explicit object, allocated once per batch and written in place).

    Self-attention keys and values of every layer live in one tensor each, grown by doubling up to the
    longest output of the batch: a step writes its position in place, a beam reorder is one gather over
    all layers (only the positions written, into a spare buffer), and a step allocates nothing.
    (Growing the cache by concatenation copied it in every layer at every step: a cost quadratic in
    the output length.) The beams of a sentence attend to the same source, so its encoder-decoder keys
    and values are kept once per sentence (the beams are folded into the query axis, see
    ``DecoderLayer.step``): they move only when sentences are pruned. After a pruning the rows in use
    are the first n' * beam.
    """

    self_k: Tensor  # [L, R, H, T', d_k] keys of the target prefixes; positions < length are written
    self_v: Tensor  # [L, R, H, T', d_v]
    cross_k: Tensor  # [L, n, H, S, d_k] encoder-decoder keys, projected once per sentence
    cross_v: Tensor  # [L, n, H, S, d_v]
    src_mask: Tensor  # [n, 1, 1, S] added to the cross-attention logits: 0, or -inf at padding
    layers: list[StepWeights]  # per layer, its weights as ``DecoderLayer.step`` reads them
    spare_k: Tensor  # the buffers a reorder gathers into, shaped as self_k and self_v
    spare_v: Tensor
    beam: int = 1  # rows per sentence
    length: int = 0  # target positions decoded so far

    max_len: int = 1024  # positions the outputs may take; the buffers hold fewer until needed

    def make_room(self) -> None:
        """Room for position ``length``: the buffers start small and double, up to ``max_len``.
        (Most outputs end far before their limit, input + 50; buffers sized for it at once would be
        mostly memory never written, and each batch would pay the operating system for its pages.)"""
        room = self.self_k.size(3)
        if self.length < room:
            return
        grown = [t.new_empty(*t.shape[:3], min(2 * room, self.max_len), t.size(4))
                 for t in (self.self_k, self.self_v, self.spare_k, self.spare_v)]
        grown[0][:, :, :, :room], grown[1][:, :, :, :room] = self.self_k, self.self_v
        self.self_k, self.self_v, self.spare_k, self.spare_v = grown

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Continue rows ``rows`` [n' * beam] (repeats allowed), the beams of each sentence together
        (beam reordering); ``sentences`` [n'] the sentences they belong to, when some were pruned.

        The kept rows' written positions are gathered, for all layers at once, into a second buffer
        of the same size, and the two swap roles: one copy per step, nothing allocated. (Gathering in
        place needs a temporary and a slower indexing kernel.)"""
        t, r = self.length, rows.numel()
        torch.index_select(self.self_k.narrow(3, 0, t), 1, rows, out=self.spare_k.narrow(1, 0, r).narrow(3, 0, t))
        torch.index_select(self.self_v.narrow(3, 0, t), 1, rows, out=self.spare_v.narrow(1, 0, r).narrow(3, 0, t))
        self.self_k, self.spare_k, self.self_v, self.spare_v = self.spare_k, self.self_k, self.spare_v, self.self_v
        if sentences is not None:
            self.cross_k, self.cross_v = self.cross_k[:, sentences], self.cross_v[:, sentences]
            self.src_mask = self.src_mask[sentences]


class DecoderLayer(nn.Module):
    """§3.1: masked self-attention, encoder-decoder attention, FFN; each a post-norm residual (§5.4), or
    pre-norm (``residual``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d_k, d_v = cfg.head_dims
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, d_k, d_v, cfg.p_drop_attn, cfg.bias)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, d_k, d_v, cfg.p_drop_attn, cfg.bias)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.p_drop_relu)
        self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.norm3 = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.drop = Dropout(cfg.p_drop)
        self.pre = cfg.norm == "pre"

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """x [B, T, D], the whole prefix, causally masked (§3.2.3) -> [B, T, D]."""
        x = residual(x, self.norm1, self.drop, self.pre,
                     lambda h: self.self_attn.attend(*self.self_attn.project_qkv(h), is_causal=True))
        x = residual(x, self.norm2, self.drop, self.pre,
                     lambda h: self.cross_attn(h, *self.cross_attn.project_kv(memory), mask=src_mask))
        return residual(x, self.norm3, self.drop, self.pre, self.ffn)

    def step_weights(self) -> StepWeights:
        """This layer's weights for ``step``: made per batch (a model in training changes them), or once
        for a model that only decodes (``Transformer.keep_step_weights``)."""
        a, c = self.self_attn, self.cross_attn
        norms = tuple((n.weight, n.bias) for n in (self.norm1, self.norm2, self.norm3))
        return StepWeights(prepared((a.q_proj, a.k_proj, a.v_proj)), prepared((a.out_proj,)), prepared((c.q_proj,)),
                           prepared((c.out_proj,)), prepared((self.ffn.w1,)), prepared((self.ffn.w2,)), norms,
                           self.norm1.eps, a.n_heads, a.d_k, a.d_v, self.pre)

    @staticmethod
    def step(x: Tensor, cache: DecoderCache, i: int) -> Tensor:
        """The newest position of every row, x [R, D] -> [R, D], as ``forward`` computes it for that
        position (inference: no dropout), for layer ``i`` of the cache. Self-attention: the position's
        key and value are written into the cache at ``cache.length`` and it attends to its row's
        positions 0..length. Cross-attention: a sentence's ``beam`` rows are ``beam`` queries of one
        source, whose keys and values the cache holds once. Written out as plain calls on the weights
        ``step_weights`` gathered (``tests/test_model.py`` holds it to ``forward``)."""
        w, t, r = cache.layers[i], cache.length, x.size(0)
        heads, d_k, d_v, eps, pre = w.heads, w.d_k, w.d_v, w.eps, w.pre
        (g1, b1), (g2, b2), (g3, b3) = w.norms
        d = x.size(-1)
        h = F.layer_norm(x, (d,), g1, b1, eps) if pre else x
        q, k, v = project(w.qkv, h).split([heads * d_k, heads * d_k, heads * d_v], -1)
        k_cache, v_cache = cache.self_k[i], cache.self_v[i]
        k_cache[:r, :, t] = k.view(r, heads, d_k)
        v_cache[:r, :, t] = v.view(r, heads, d_v)
        a, _ = attention(q.view(r, heads, 1, d_k), k_cache[:r, :, : t + 1], v_cache[:r, :, : t + 1])
        h = project(w.self_out, a.reshape(r, heads * d_v))
        x = x + h if pre else F.layer_norm(x + h, (d,), g1, b1, eps)
        h = F.layer_norm(x, (d,), g2, b2, eps) if pre else x
        q = project(w.cross_q, h).view(-1, cache.beam, heads, d_k).transpose(1, 2)  # [n, H, beam, d_k]
        a, _ = attention(q, cache.cross_k[i], cache.cross_v[i], cache.src_mask)
        h = project(w.cross_out, a.transpose(1, 2).reshape(r, heads * d_v))
        x = x + h if pre else F.layer_norm(x + h, (d,), g2, b2, eps)
        h = F.layer_norm(x, (d,), g3, b3, eps) if pre else x
        h = project(w.w2, project(w.w1, h, relu=True))  # eq. (2)
        return x + h if pre else F.layer_norm(x + h, (d,), g3, b3, eps)


def sinusoidal_positions(length: int, d_model: int, offset: int = 0, device: torch.device | None = None) -> Tensor:
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    The paper's interleaved layout and d_model/2 denominator (the authors' code concatenated sin|cos
    with a d/2-1 denominator; A6). Positions start at 0. Computed in float64, so any length works.
    """
    pos = torch.arange(offset, offset + length, dtype=torch.float64, device=device)[:, None]
    i2 = torch.arange(0, d_model, 2, dtype=torch.float64, device=device)  # 2i
    angle = pos / 10000.0 ** (i2 / d_model)  # [L, ceil(D/2)]
    pe = torch.zeros(length, d_model, dtype=torch.float64, device=device)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.float()


class Embedding(nn.Module):
    """§3.4: learned embeddings multiplied by √d_model; also the pre-softmax projection when tied.

    Initialised N(0, d_model^-0.5), so the scaled lookups have unit variance (A8). The PAD row is
    zeroed at lookup (A5), which also makes the start symbol the zero vector.
    """

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        nn.init.normal_(self.weight, std=d_model**-0.5)
        self.scale = math.sqrt(d_model)

    def forward(self, tokens: Tensor) -> Tensor:
        x = F.embedding(tokens, self.weight) * self.scale  # §3.4: multiply by √d_model
        return x.masked_fill((tokens == PAD_ID)[..., None], 0.0)


class PositionsError(UserError):
    """A sentence longer than a learned position table (Table 3 row E) has rows: the user's input, not a bug."""


class Transformer(nn.Module):
    """Encoder-decoder Transformer (§3, Figure 1), configured by ``ModelConfig``.

    ``forward(src, tgt_in)`` gives logits for teacher forcing; ``encode`` + ``init_cache`` +
    ``decode_step`` decode one token at a time with cached keys and values.
    """

    def __init__(self, cfg: ModelConfig, vocab_size: int, qkv_gain: float = 1.0):
        super().__init__()
        self.cfg, self.vocab_size = cfg, vocab_size
        # §3.4: one weight matrix for both embeddings and the pre-softmax projection; the module
        # names below are the checkpoint format, so a tied matrix is stored exactly once.
        if cfg.share_embeddings:
            self.embed = Embedding(vocab_size, cfg.d_model)
        else:
            self.src_embed = Embedding(vocab_size, cfg.d_model)
            self.tgt_embed = Embedding(vocab_size, cfg.d_model)
        if not cfg.share_output:
            self.output_proj = nn.Linear(cfg.d_model, vocab_size, bias=False)
        if cfg.positional == "learned":  # Table 3 row (E)
            self.src_pos = nn.Embedding(cfg.max_positions, cfg.d_model)
            self.tgt_pos = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_enc_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_dec_layers))
        if cfg.norm == "pre":  # each stack ends with a LayerNorm (A0, A7), else its output is unnormalised
            self.enc_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
            self.dec_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.drop = Dropout(cfg.p_drop)
        self._sinusoids: Tensor | None = None  # §3.5 table cache (not a parameter, not saved)
        self._step_weights: list[StepWeights] | None = None  # kept by keep_step_weights (decoding only)
        self.reset_parameters(qkv_gain)

    def reset_parameters(self, qkv_gain: float = 1.0) -> None:
        """Xavier-uniform linear weights, zero biases (A8); embeddings keep N(0, d^-0.5), and so does an
        untied pre-softmax projection (model.share_output = false), as the authors' code draws its softmax
        matrix (A8), not as the linear layer it is here.

        ``qkv_gain`` scales the Xavier bound of the query, key and value projections (train.init_qkv_gain):
        1 draws each as the separate matrix it is (A8, the authors' later code); 1/√2 gives a self-attention
        projection the bound of one third of a fused [d, 3d] kernel, as the authors' first code and fairseq
        draw them. The draws are the same for every gain, only scaled."""
        qkv = {id(p) for m in self.modules() if isinstance(m, MultiHeadAttention)
               for p in (m.q_proj.weight, m.k_proj.weight, m.v_proj.weight)}
        for module in self.modules():
            if isinstance(module, nn.Linear):
                # DEVIATION(A8) at a qkv_gain other than 1 (train.init_qkv_gain)
                nn.init.xavier_uniform_(module.weight, gain=qkv_gain if id(module.weight) in qkv else 1.0)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):  # learned positions
                nn.init.normal_(module.weight, std=self.cfg.d_model**-0.5)
        if "output_proj" in self._modules:
            nn.init.normal_(self.output_proj.weight, std=self.cfg.d_model**-0.5)

    @property
    def source_embedding(self) -> Embedding:
        return self.embed if self.cfg.share_embeddings else self.src_embed

    @property
    def target_embedding(self) -> Embedding:
        return self.embed if self.cfg.share_embeddings else self.tgt_embed

    def positions(self, length: int, offset: int, table: str, device: torch.device) -> Tensor:
        """[L, D] positional encodings for positions offset .. offset+length-1 (§3.5), in the embeddings'
        dtype (fp32; bf16 for a model decoding in bf16, whose sums would otherwise turn fp32)."""
        if self.cfg.positional == "sinusoidal":
            # computed once and grown on demand (decoding asks for one position per step): any
            # length works, a sentence longer than any in training included
            end, dtype = offset + length, self.source_embedding.weight.dtype
            table_ = self._sinusoids
            if table_ is None or table_.size(0) < end or table_.device != device or table_.dtype != dtype:
                size = max(end, 2 * table_.size(0) if table_ is not None else 512)
                self._sinusoids = table_ = sinusoidal_positions(size, self.cfg.d_model, 0, device).to(dtype)
            return table_[offset:end]
        if offset + length > self.cfg.max_positions:
            raise PositionsError(f"a sequence of {offset + length} positions, more than the learned position table "
                                 f"holds (model.max_positions = {self.cfg.max_positions}): give a shorter sentence")
        return getattr(self, table).weight[offset: offset + length]

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src [B, S] -> memory z [B, S, D] and its padding mask [B, 1, 1, S]."""
        src_mask = padding_mask(src)
        x = self.source_embedding(src) + self.positions(src.size(1), 0, "src_pos", src.device)
        x = autocast_stream(self.drop(x), self.cfg.norm == "pre")  # §5.4: dropout on the embeddings' sums
        for layer in self.encoder:
            x = layer(x, src_mask)
        return self.final_norm(x, "enc_norm"), src_mask

    def final_norm(self, x: Tensor, name: str) -> Tensor:
        """The stack's closing LayerNorm under pre-norm; post-norm layers already end normalised."""
        # DEVIATION(§3.1): pre-norm (model.norm = "pre") sums un-normalised residuals, so each stack
        # ends with a LayerNorm of its own, as the authors' later code does (A0); post-norm has none
        return self._modules[name](x) if name in self._modules else x

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Teacher-forced decoder: tgt_in [B, T] (starts with the start symbol) -> hidden [B, T, D]."""
        x = self.target_embedding(tgt_in) + self.positions(tgt_in.size(1), 0, "tgt_pos", tgt_in.device)
        x = autocast_stream(self.drop(x), self.cfg.norm == "pre")
        for layer in self.decoder:
            x = layer(x, memory, src_mask)
        return self.final_norm(x, "dec_norm")

    def project(self, hidden: Tensor) -> Tensor:
        """Pre-softmax linear transformation (§3.4): [..., D] -> logits [..., V]; no bias."""
        if "output_proj" in self._modules:  # untied, or a quantized copy of the tied weights
            return apply(self.output_proj, hidden)
        return linear(hidden, self.target_embedding.weight)

    @property
    def max_output_length(self) -> int | None:
        """The most target positions an output can have, its EOS included: the learned table's rows (Table 3
        row E); None for sinusoids, which have no end."""
        return self.cfg.max_positions if self.cfg.positional == "learned" else None

    @property
    def output_weight(self) -> Tensor:
        """The pre-softmax projection's weight [V, D]: the target embedding's when tied (§3.4)."""
        return self.output_proj.weight if "output_proj" in self._modules else self.target_embedding.weight

    def forward(self, src: Tensor, tgt_in: Tensor, logits: bool = True) -> Tensor:
        """src [B, S], tgt_in [B, T] -> logits [B, T, V]. ``logits=False``: the decoder's output [B, T, D]
        before the projection, for ``loss.label_smoothed_loss`` to project, which training does at the target
        positions alone (``train.batch_losses``): the output projection is the largest matmul."""
        memory, src_mask = self.encode(src)
        hidden = self.decode(tgt_in, memory, src_mask)
        return self.project(hidden) if logits else hidden

    def init_cache(self, memory: Tensor, src_mask: Tensor, beam: int = 1, max_len: int = 1024) -> DecoderCache:
        """The decoding state of memory [n, S, D]'s sentences, ``beam`` rows each, for outputs of at most
        ``max_len`` positions: every layer's encoder-decoder keys/values projected once per sentence,
        the self-attention caches allocated once. The layers' step weights (fused Q/K/V included) are
        gathered here, once per batch, and kept in the cache, not on the model: a model in training
        changes them at every update (a model that only decodes keeps them: ``keep_step_weights``)."""
        n, layers = memory.size(0), list(self.decoder)
        attn = layers[0].self_attn
        room = min(max_len, 16)  # grown by make_room
        self_k = memory.new_empty(len(layers), n * beam, attn.n_heads, room, attn.d_k)
        self_v = memory.new_empty(len(layers), n * beam, attn.n_heads, room, attn.d_v)
        cross = [layer.cross_attn.project_kv(memory) for layer in layers]
        return DecoderCache(self_k, self_v, torch.stack([k for k, _ in cross]), torch.stack([v for _, v in cross]),
                            memory.new_zeros(src_mask.shape).masked_fill_(~src_mask, float("-inf")),
                            self._step_weights or [layer.step_weights() for layer in layers],
                            torch.empty_like(self_k), torch.empty_like(self_v), beam, max_len=max_len)

    def keep_step_weights(self) -> None:
        """Gathers the decoder layers' step weights (the fused Q/K/V included) once, for a model that only
        decodes from now on, on the device it stays on (``Translator`` loads one so): ``init_cache`` then
        reuses them instead of gathering them for every batch, which at batch 1 is every sentence. A
        model in training must not keep them: its updates would not reach the fused copies."""
        self._step_weights = [layer.step_weights() for layer in self.decoder]

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        """tokens [R] (the cache's rows in use) at position cache.length -> logits [R, V]; the cache
        holds one more position. The same function as ``forward`` at that position (§3.2.3's mask is
        the cache: a row sees only what it has written)."""
        cache.make_room()
        pos = self.positions(1, cache.length, "tgt_pos", tokens.device)  # [1, D]
        x = self.target_embedding(tokens) + pos  # [R, D]
        for i in range(len(cache.layers)):
            x = DecoderLayer.step(x, cache, i)
        cache.length += 1
        return self.project(self.final_norm(x, "dec_norm"))


def on_meta(cfg: ModelConfig, vocab_size: int) -> Transformer:
    """The model built on the meta device: its weights' shapes, nothing allocated (a big model's count at once).
    The first such build imports torch._dynamo, and triton with it: the stop signals wait until it is done
    (``errors.stops_held``), where Ctrl-C inside triton's bindings aborted the process or was lost."""
    with stops_held(), torch.device("meta"):
        return Transformer(cfg, vocab_size)


@contextlib.contextmanager
def record_attention(model: Transformer) -> Iterator[dict[str, list[list[Tensor]]]]:
    """Collects attention weights [B, H, Tq, Tk] of every layer while the block runs.

    Yields {"enc_self": [...], "dec_self": [...], "cross": [...]}, one list per layer, each holding
    the weights of every call (one per forward, or one per step when decoding incrementally).
    """
    groups = {
        "enc_self": [layer.self_attn for layer in model.encoder],
        "dec_self": [layer.self_attn for layer in model.decoder],
        "cross": [layer.cross_attn for layer in model.decoder],
    }
    records: dict[str, list[list[Tensor]]] = {kind: [] for kind in groups}
    for kind, modules in groups.items():
        for module in modules:
            module.record = []
            records[kind].append(module.record)
    try:
        yield records
    finally:
        for modules in groups.values():
            for module in modules:
                module.record = None


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


FLOPS_SENTENCE_LEN = 27.0  # the length FLOPs per token are quoted at: WMT14 EN-DE's mean sentence in 37k BPE pieces


def flops_per_token(cfg: ModelConfig, vocab_size: int, src_len: float = FLOPS_SENTENCE_LEN,
                    tgt_len: float = FLOPS_SENTENCE_LEN) -> float:
    """Training FLOPs per target token: 3 × forward matmul FLOPs (a multiply-add = 2 FLOPs).

    Counts the projections, the FFN, QKᵀ and AV (over full lengths S and T) and the output
    projection, with as many source as target tokens; layer norms, softmax and the optimizer are
    left out, so MFU computed from it counts only useful matmul work.
    """
    d, h, d_ff = cfg.d_model, cfg.n_heads, cfg.d_ff
    d_k, d_v = cfg.head_dims
    qkvo = 2 * d * h * (2 * d_k + 2 * d_v)  # Q, K, V, O projections of one token
    attn = lambda length: 2 * length * h * (d_k + d_v)  # noqa: E731  QKᵀ and AV for one query
    ffn = 4 * d * d_ff
    enc = cfg.n_enc_layers * (qkvo + ffn + attn(src_len))
    # self-attention QKVO + cross-attention QO on the target and KV on the (equally long) source
    dec = cfg.n_dec_layers * (2 * qkvo + attn(tgt_len) + attn(src_len) + ffn)
    return 3.0 * (enc + dec + 2 * d * vocab_size)
