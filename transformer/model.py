"""The Transformer of "Attention Is All You Need" (§3): encoder-decoder built only from attention.

Shape legend: B batch, S source length, T target length, D d_model, H heads, V vocabulary,
d_k / d_v per-head sizes. Masks are boolean with True = "may attend" (the convention of
``torch.nn.functional.scaled_dot_product_attention``); they are built only in ``padding_mask``.

Token ids: PAD = 0 doubles as the decoder's start symbol. Its embedding is zero at lookup, so the
first decoder input is the zero vector plus PE(0), as in the authors' code (IMPLEMENTATION-NOTES A5).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .tokenizer import PAD_ID


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout (§5.4): zero each element with probability p, scale the rest by 1/(1-p).

    On CPU the mask comes from 16-bit slices of 64-bit random words (p quantised to 1/65536):
    ``bernoulli_`` draws one random number per element, this one per four elements, and random
    numbers are a dropout mask's whole cost. Other devices use ``F.dropout``.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    n = x.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(torch.iinfo(torch.int64).min, None)
    keep = words.view(torch.int16)[:n].view(x.shape) >= round(p * 65536) - 32768  # P(keep) = 1 - p
    return x * keep.to(x.dtype).mul_(1.0 / (1.0 - p))


class Dropout(nn.Module):
    """``nn.Dropout`` with the fast CPU mask of ``dropout``."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def padding_mask(tokens: Tensor) -> Tensor:
    """[B, S] ids -> [B, 1, 1, S] bool, True where a key is a real token (broadcast over heads, queries)."""
    return (tokens != PAD_ID)[:, None, None, :]


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, is_causal: bool = False,
              dropout_p: float = 0.0, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention (§3.2.1, eq. 1): softmax(QKᵀ/√d_k)V.

    q [B, H, Tq, d_k], k [B, H, Tk, d_k], v [B, H, Tk, d_v] -> [B, H, Tq, d_v]. Masked logits are
    set to -inf before the softmax. On accelerators the fast path is PyTorch's fused SDPA (flash /
    memory-efficient kernels). The explicit path computes eq. (1) as written and also returns the
    weights [B, H, Tq, Tk] (figures and tests need them); on CPU it is the faster one at translation
    lengths (a Multi30k training step: 0.58 s against 0.67 s through SDPA's CPU kernel; a tie at
    60 tokens), so CPU always takes it.
    """
    if not need_weights and q.device.type != "cpu":
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
        return out, None
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # eq. (1): QKᵀ/√d_k
    if is_causal:
        tq, tk = scores.shape[-2:]
        causal = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
        mask = causal if mask is None else mask & causal
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
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
        side: one larger product and one backward instead of two or three small ones. Inference
        calls them one by one: concatenating the weights at every decoding step would cost what it
        saves, and int8 copies (``translator.quantize_int8``) hold no float weights to concatenate.
        """
        if torch.is_grad_enabled() and all(type(m) is nn.Linear for m in projections):
            bias = None if projections[0].bias is None else torch.cat([m.bias for m in projections])
            fused = F.linear(x, torch.cat([m.weight for m in projections]), bias)
            outputs = fused.split([m.out_features for m in projections], -1)
        else:
            outputs = [m(x) for m in projections]
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
        return self.attend(self.split_heads(self.q_proj(x), self.d_k), k, v, mask, is_causal)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
               is_causal: bool = False) -> Tensor:
        """q, k, v projected and split into heads -> the heads' outputs concatenated and projected, [B, Tq, D]."""
        p = self.p_drop_attn if self.training else 0.0
        out, weights = attention(q, k, v, mask, is_causal, p, need_weights=self.record is not None)
        if self.record is not None:
            self.record.append(weights.detach())
        return self.out_proj(out.transpose(1, 2).flatten(2))  # [B, H, Tq, d_v] -> [B, Tq, H*d_v] -> [B, Tq, D]


class FeedForward(nn.Module):
    """Position-wise feed-forward network (§3.3, eq. 2): FFN(x) = max(0, xW1 + b1)W2 + b2."""

    def __init__(self, d_model: int, d_ff: int, p_drop_relu: float):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff)
        self.w2 = nn.Linear(d_ff, d_model)
        self.p_drop_relu = p_drop_relu

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(dropout(F.relu(self.w1(x)), self.p_drop_relu, self.training))  # eq. (2)


def residual(x: Tensor, norm: nn.LayerNorm, drop: Dropout, pre: bool,
             sublayer: Callable[[Tensor], Tensor]) -> Tensor:
    """A sub-layer with its residual connection: post-norm LayerNorm(x + Dropout(Sublayer(x))) (§3.1,
    §5.4); or pre-norm x + Dropout(Sublayer(LayerNorm(x))) when ``pre`` (DEVIATION(§3.1): model.norm =
    "pre", the authors' later default, A0)."""
    if pre:
        return x + drop(sublayer(norm(x)))
    return norm(x + drop(sublayer(x)))


class EncoderLayer(nn.Module):
    """§3.1: self-attention then FFN, each wrapped as LayerNorm(x + Dropout(Sublayer(x))) (§5.4)."""

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


@dataclass
class LayerCache:
    """One decoder layer's incremental-decoding state (a small explicit object, as torchtune's)."""

    self_k: Tensor  # [n*beam, H, t, d_k] keys of the target prefixes, grown by one per step
    self_v: Tensor  # [n*beam, H, t, d_v]
    cross_k: Tensor  # [n, H, S, d_k] encoder-decoder keys, projected once per sentence, shared by its beams
    cross_v: Tensor  # [n, H, S, d_v]
    rows: Tensor | None = None  # rows of self_k/self_v that continue (a reorder not yet carried out)

    def append(self, k: Tensor, v: Tensor) -> None:
        """Continue the prefixes' keys and values with the newest position's k, v [n*beam, H, 1, d].

        A pending reorder and the append are one copy: the kept rows are gathered straight into the
        longer tensor. (Reordering, then concatenating, copied the whole cache twice per step: a
        fifth of beam search's time on long outputs.)
        """
        self.self_k, self.self_v = (self._extend(cached, new) for cached, new in ((self.self_k, k), (self.self_v, v)))
        self.rows = None

    def _extend(self, cached: Tensor, new: Tensor) -> Tensor:
        t = cached.size(2)
        out = new.new_empty(new.size(0), new.size(1), t + 1, new.size(3))
        if self.rows is None:
            out[:, :, :t] = cached
        else:
            torch.index_select(cached, 0, self.rows, out=out[:, :, :t])
        out[:, :, t:] = new
        return out


@dataclass
class DecoderCache:
    """State of incremental decoding for n sentences with ``beam`` prefixes (rows) each, sentence-major.

    The beams of a sentence attend to the same source, so its encoder-decoder keys and values are
    kept once per sentence (the beams are folded into the query axis, see ``DecoderLayer``): a beam
    reorder moves only the self-attention cache, and the source side moves only when sentences are
    pruned; per-beam copies of the source side would be moved at every step for nothing.
    """

    layers: list[LayerCache]
    src_mask: Tensor  # [n, 1, 1, S]
    length: int = 0  # target positions decoded so far
    beam: int = 1  # rows per sentence

    def expand(self, beam: int) -> None:
        """Give each sentence ``beam`` rows (before the first step of beam search)."""
        for c in self.layers:
            c.self_k, c.self_v = c.self_k.repeat_interleave(beam, 0), c.self_v.repeat_interleave(beam, 0)
        self.beam *= beam

    def reorder(self, rows: Tensor) -> None:
        """Continue rows ``rows`` [n' * beam] (repeats allowed), given sentence by sentence: the
        ``beam`` entries of each sentence are rows of one sentence (beam reordering, pruning)."""
        for c in self.layers:  # carried out by the next append (LayerCache.append)
            c.rows = rows if c.rows is None else c.rows.index_select(0, rows)
        sentences = rows[:: self.beam] // self.beam  # [n']
        if sentences.numel() == self.src_mask.size(0) and bool((sentences == torch.arange(
                sentences.numel(), device=sentences.device)).all()):
            return  # no sentence was pruned: the source side stays as it is
        for c in self.layers:
            c.cross_k, c.cross_v = c.cross_k.index_select(0, sentences), c.cross_v.index_select(0, sentences)
        self.src_mask = self.src_mask.index_select(0, sentences)


class DecoderLayer(nn.Module):
    """§3.1: masked self-attention, encoder-decoder attention, FFN; each post-norm residual (§5.4)."""

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

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor, cache: LayerCache | None = None,
                beam: int = 1) -> Tensor:
        """x [B, T, D]. Without a cache: the whole prefix, causally masked (§3.2.3). With one: x is
        the newest position [n*beam, 1, D], attending to the cached prefix and itself; the cross-
        attention sees a sentence's ``beam`` rows as ``beam`` queries [n, beam, D] of one source."""
        if cache is None:
            x = residual(x, self.norm1, self.drop, self.pre,
                         lambda h: self.self_attn.attend(*self.self_attn.project_qkv(h), is_causal=True))
            x = residual(x, self.norm2, self.drop, self.pre,
                         lambda h: self.cross_attn(h, *self.cross_attn.project_kv(memory), mask=src_mask))
        else:
            def self_attn(h: Tensor) -> Tensor:
                cache.append(*self.self_attn.project_kv(h))
                return self.self_attn(h, cache.self_k, cache.self_v)

            def cross_attn(h: Tensor) -> Tensor:  # a sentence's beams as queries [n, beam, D]
                return self.cross_attn(h.view(-1, beam, h.size(-1)), cache.cross_k, cache.cross_v,
                                       mask=src_mask).view_as(h)
            x = residual(x, self.norm1, self.drop, self.pre, self_attn)
            x = residual(x, self.norm2, self.drop, self.pre, cross_attn)
        return residual(x, self.norm3, self.drop, self.pre, self.ffn)


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


class Transformer(nn.Module):
    """Encoder-decoder Transformer (§3, Figure 1), configured by ``ModelConfig``.

    ``forward(src, tgt_in)`` gives logits for teacher forcing; ``encode`` + ``init_cache`` +
    ``decode_step`` decode one token at a time with cached keys and values.
    """

    def __init__(self, cfg: ModelConfig, vocab_size: int):
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
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform linear weights, zero biases (A8); embeddings keep N(0, d^-0.5)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):  # learned positions
                nn.init.normal_(module.weight, std=self.cfg.d_model**-0.5)

    @property
    def source_embedding(self) -> Embedding:
        return self.embed if self.cfg.share_embeddings else self.src_embed

    @property
    def target_embedding(self) -> Embedding:
        return self.embed if self.cfg.share_embeddings else self.tgt_embed

    def positions(self, length: int, offset: int, table: str, device: torch.device) -> Tensor:
        """[L, D] positional encodings for positions offset .. offset+length-1 (§3.5)."""
        if self.cfg.positional == "sinusoidal":
            # computed once and grown on demand (decoding asks for one position per step): any
            # length works, a sentence longer than any in training included
            end = offset + length
            table_ = self._sinusoids
            if table_ is None or table_.size(0) < end or table_.device != device:
                size = max(end, 2 * table_.size(0) if table_ is not None else 512)
                self._sinusoids = table_ = sinusoidal_positions(size, self.cfg.d_model, 0, device)
            return table_[offset:end]
        if offset + length > self.cfg.max_positions:
            raise ValueError(f"sequence of {offset + length} positions exceeds the learned position "
                             f"table (model.max_positions = {self.cfg.max_positions})")
        return getattr(self, table).weight[offset: offset + length]

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src [B, S] -> memory z [B, S, D] and its padding mask [B, 1, 1, S]."""
        src_mask = padding_mask(src)
        x = self.source_embedding(src) + self.positions(src.size(1), 0, "src_pos", src.device)
        x = self.drop(x)  # §5.4: dropout on the sums of embeddings and positional encodings
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
        x = self.drop(x)
        for layer in self.decoder:
            x = layer(x, memory, src_mask)
        return self.final_norm(x, "dec_norm")

    def project(self, hidden: Tensor) -> Tensor:
        """Pre-softmax linear transformation (§3.4): [..., D] -> logits [..., V]; no bias."""
        if "output_proj" in self._modules:  # untied, or a quantized copy of the tied weights
            return self.output_proj(hidden)
        return F.linear(hidden, self.target_embedding.weight)

    @property
    def output_weight(self) -> Tensor:
        """The pre-softmax projection's weight [V, D]: the target embedding's when tied (§3.4)."""
        return self.output_proj.weight if "output_proj" in self._modules else self.target_embedding.weight

    def forward(self, src: Tensor, tgt_in: Tensor, positions: Tensor | None = None, logits: bool = True) -> Tensor:
        """src [B, S], tgt_in [B, T] -> logits [B, T, V]; with ``positions`` (bool [B, T]) only
        the logits of those positions, [N, V]: training projects only where there is a target,
        since the output projection is the largest matmul. ``logits=False``: the decoder's output
        before the projection ([B, T, D] or [N, D]), for ``loss.label_smoothed_loss`` to project."""
        memory, src_mask = self.encode(src)
        hidden = self.decode(tgt_in, memory, src_mask)
        hidden = hidden if positions is None else hidden[positions]
        return self.project(hidden) if logits else hidden

    def init_cache(self, memory: Tensor, src_mask: Tensor) -> DecoderCache:
        """Projects the encoder-decoder keys/values once per sentence, for every decoder layer."""
        layers = []
        for layer in self.decoder:
            ck, cv = layer.cross_attn.project_kv(memory)
            empty_k = memory.new_zeros(memory.size(0), layer.self_attn.n_heads, 0, layer.self_attn.d_k)
            empty_v = memory.new_zeros(memory.size(0), layer.self_attn.n_heads, 0, layer.self_attn.d_v)
            layers.append(LayerCache(empty_k, empty_v, ck, cv))
        return DecoderCache(layers, src_mask)

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        """tokens [B] at position cache.length -> logits [B, V]; the cache grows by one position."""
        x = self.target_embedding(tokens[:, None]) + self.positions(1, cache.length, "tgt_pos", tokens.device)
        for layer, layer_cache in zip(self.decoder, cache.layers):
            x = layer(x, None, cache.src_mask, layer_cache, cache.beam)
        cache.length += 1
        return self.project(self.final_norm(x[:, 0], "dec_norm"))


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


def flops_per_token(cfg: ModelConfig, vocab_size: int, src_len: float = 30.0, tgt_len: float = 30.0) -> float:
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
