"""The model against the paper's formulas (§3) and against independent references."""

import dataclasses
import math

import pytest
import torch
from torch import nn

from transformer.config import ModelConfig, load_config
from transformer.data import Example, collate
from transformer.model import (_ONEDNN, Dropout, MultiHeadAttention, PositionsError, Transformer, attention,
                               count_parameters, dropout, pack_for_inference, padding_mask, record_attention,
                               sinusoidal_positions)
from transformer.tokenizer import PAD_ID

TINY = ModelConfig(n_enc_layers=2, n_dec_layers=2, d_model=32, d_ff=64, n_heads=4, p_drop=0.0)


def tiny_model(seed: int = 0, cfg: ModelConfig = TINY, vocab: int = 50) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg, vocab).eval()


def test_attention_equals_equation_1_by_hand():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 2)
    expected = torch.zeros(3, 2)
    for i in range(3):  # softmax_j(q_i·k_j / √d_k) v_j, element by element
        scores = [float(q[0, 0, i] @ k[0, 0, j]) / math.sqrt(4) for j in range(5)]
        z = sum(math.exp(s) for s in scores)
        for j in range(5):
            expected[i] += math.exp(scores[j]) / z * v[0, 0, j]
    fast, _ = attention(q, k, v)
    slow, weights = attention(q, k, v, need_weights=True)
    torch.testing.assert_close(fast[0, 0], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(slow[0, 0], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 1, 3))


def test_masked_keys_get_zero_weight_and_do_not_change_the_output():
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    tokens = torch.tensor([[5, 6, 7, PAD_ID, PAD_ID], [5, 6, 7, 8, 9]])
    mask = padding_mask(tokens)
    out, weights = attention(q, k, v, mask, need_weights=True)
    assert torch.all(weights[0, :, :, 3:] == 0)
    fast, _ = attention(q, k, v, mask)
    torch.testing.assert_close(fast, out, atol=1e-5, rtol=1e-5)
    # changing what sits under the mask changes nothing
    k2, v2 = k.clone(), v.clone()
    k2[0, :, 3:], v2[0, :, 3:] = 100.0, -100.0
    torch.testing.assert_close(attention(q, k2, v2, mask)[0][0], fast[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("is_causal", [False, True])
def test_fused_kernel_used_on_accelerators_equals_the_explicit_path(is_causal):
    torch.manual_seed(2)
    q, k, v = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 3)
    mask = padding_mask(torch.tensor([[5, 6, 7, PAD_ID, PAD_ID], [5, 6, 7, 8, 9]]))
    fused = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False) \
        if not is_causal else torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    explicit, _ = attention(q, k, v, None if is_causal else mask, is_causal)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("is_causal", [False, True])
def test_large_scores_on_a_cpu_take_the_blockwise_kernel(monkeypatch, is_causal):
    """A line of 34,001 pieces asked the explicit path for 18.5 GB of scores at once, and the kernel killed the
    process without a word; past LARGE_SCORES the CPU takes SDPA, whose kernel works in blocks: the same output."""
    from transformer import model

    torch.manual_seed(4)
    q, k, v = torch.randn(2, 4, 20, 8), torch.randn(2, 4, 20, 8), torch.randn(2, 4, 20, 8)
    mask = None if is_causal else padding_mask(torch.tensor([[5] * 17 + [PAD_ID] * 3, [5] * 20]))
    explicit, _ = attention(q, k, v, mask, is_causal, need_weights=True)
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or
                        sdpa(*a, **kw))
    attention(q, k, v, mask, is_causal)
    assert not calls  # 2 x 4 x 20 x 20 scores: the explicit path
    monkeypatch.setattr(model, "LARGE_SCORES", 2 * 4 * 20 * 20 - 1)
    blockwise, _ = attention(q, k, v, mask, is_causal)
    assert calls == [1]
    torch.testing.assert_close(blockwise, explicit, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout_keeps_1_minus_p_and_rescales(p):
    torch.manual_seed(3)
    x = torch.ones(1000, 1001)  # odd size: the mask is cut from whole 64-bit words
    y = dropout(x, p, training=True)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.003
    scale = 65536 / (65536 - round(p * 65536))  # the quantised p's 1/(1-p): within 1e-5 of p's own
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], scale))
    assert abs(scale * (1 - p) - 1) < 1e-5
    torch.manual_seed(3)
    assert torch.equal(dropout(x, p, training=True), y)  # seeded: resume replays the same masks
    assert dropout(x, p, training=False) is x
    x.requires_grad_(True)
    torch.manual_seed(3)
    dropout(x, p, training=True).sum().backward()
    torch.testing.assert_close(x.grad, kept.float() * scale)


@pytest.mark.parametrize("p", [0.999, 0.99999, 0.999995, 0.999999])
def test_dropout_near_1_drops_as_much_and_keeps_the_expectation(p):
    """A p within 2^-17 of 1 set the mask's threshold past int16's range: every element was kept, scaled by
    1/(1-p) (a million times at 0.999999), and below it the scale of the unquantised p drifted the mean (+4% at
    0.999, +40% at 0.99999)."""
    torch.manual_seed(3)
    y = dropout(torch.ones(4_000_000), p, training=True)
    kept = y[y != 0]
    assert 0 < kept.numel() < 4 * 4_000_000 * (1 - p)
    dropped = round(p * 65536)  # a kept element times its chance of being kept: 1, the expectation of x
    chance = 1 - dropped / 65536 if dropped < 65536 else 1 - p  # past the mask's resolution: F.dropout's own
    torch.testing.assert_close(kept * chance, torch.ones_like(kept))


def test_dropout_sits_where_section_5_4_puts_it():
    """§5.4: dropout on "the sums of the embeddings and the positional encodings in both the encoder and decoder
    stacks", and on "the output of each sub-layer, before it is added to the sub-layer input and normalized".
    Dropout moved onto the residual sum, or missing from one stack's embeddings, changes training and nothing
    else: every other test runs the model with dropout off."""
    cfg = dataclasses.replace(TINY, p_drop=0.5)
    model = tiny_model(cfg=cfg).train()
    drops, seen = [], {}  # every Dropout module's (module, input, output), in call order; tensors by name

    def keep(name, output=False):  # a hook that keeps a module's first input (or output) and changes nothing
        def hook(module, args, out=None):
            seen.setdefault(name, out if output else args[0])
        return hook

    for m in model.modules():
        if isinstance(m, Dropout):
            m.register_forward_hook(lambda mod, args, out: drops.append((mod, args[0], out)))
    for name, layer in (("enc", model.encoder[0]), ("dec", model.decoder[0])):
        layer.register_forward_pre_hook(keep(name + " in"))
        layer.self_attn.out_proj.register_forward_hook(keep(name + " sub", output=True))
        layer.norm1.register_forward_pre_hook(keep(name + " norm"))
    src, tgt_in = torch.tensor([[5, 6, 7, 1], [8, 1, 0, 0]]), torch.tensor([[0, 9, 10], [0, 11, 0]])
    model(src, tgt_in)
    embedded = [(x, y) for mod, x, y in drops if mod is model.drop]
    assert len(embedded) == 2  # the encoder's, then the decoder's
    for (x, y), tokens, emb, table, name in ((embedded[0], src, model.source_embedding, "src_pos", "enc"),
                                             (embedded[1], tgt_in, model.target_embedding, "tgt_pos", "dec")):
        torch.testing.assert_close(x, emb(tokens) + model.positions(tokens.size(1), 0, table, tokens.device))
        assert torch.equal(seen[name + " in"], y)  # the first layer reads the dropped sum
        layer = model.encoder[0] if name == "enc" else model.decoder[0]
        x, y = next((x, y) for mod, x, y in drops if mod is layer.drop)  # the layer's first sub-layer
        assert torch.equal(x, seen[name + " sub"]) and not torch.equal(x, y)  # its output is dropped ...
        torch.testing.assert_close(seen[name + " norm"], seen[name + " in"] + y)  # ... then added, then normalised


def test_every_sub_layer_of_every_layer_is_dropped_before_its_residual_add():
    """§5.4, "dropout to the output of each sub-layer, before it is added to the sub-layer input and
    normalized", at every sub-layer: the encoder's self-attention and FFN, the decoder's self-attention,
    encoder-decoder attention and FFN, in every layer (the test above follows the first sub-layer of each
    stack). For each: the layer's Dropout takes the sub-layer's output, drops some of it, and its LayerNorm
    reads the sub-layer's input plus the dropped output."""
    model = tiny_model(cfg=dataclasses.replace(TINY, p_drop=0.5)).train()
    seen: dict[tuple[int, str], list] = {}
    hooks = []

    def keep(key, output):
        def hook(module, args, out=None):
            seen.setdefault(key, []).append(out if output else args[0])
        return hook

    layers = [*model.encoder, *model.decoder]
    for i, layer in enumerate(layers):
        decoder = i >= len(model.encoder)
        subs = [layer.self_attn.out_proj, *([layer.cross_attn.out_proj] if decoder else []), layer.ffn.w2]
        norms = [layer.norm1, layer.norm2, *([layer.norm3] if decoder else [])]
        hooks.append(layer.register_forward_pre_hook(keep((i, "in"), False)))
        hooks.append(layer.drop.register_forward_hook(
            lambda m, a, o, i=i: seen.setdefault((i, "drop"), []).append((a[0], o))))
        for k, (sub, norm) in enumerate(zip(subs, norms)):
            hooks.append(sub.register_forward_hook(keep((i, f"sub{k}"), True)))
            hooks.append(norm.register_forward_pre_hook(keep((i, f"norm_in{k}"), False)))
            hooks.append(norm.register_forward_hook(keep((i, f"norm_out{k}"), True)))
    try:
        model(torch.tensor([[5, 6, 7, 1], [8, 1, 0, 0]]), torch.tensor([[0, 9, 10], [0, 11, 0]]))
    finally:
        for h in hooks:
            h.remove()
    for i, layer in enumerate(layers):
        n_subs = 3 if i >= len(model.encoder) else 2
        assert len(seen[(i, "drop")]) == n_subs, i  # one dropout per sub-layer
        previous = seen[(i, "in")][0]
        for k in range(n_subs):
            dropped_in, dropped = seen[(i, "drop")][k]
            assert torch.equal(dropped_in, seen[(i, f"sub{k}")][0]), (i, k)  # the sub-layer's output is dropped
            assert not torch.equal(dropped_in, dropped), (i, k)
            torch.testing.assert_close(seen[(i, f"norm_in{k}")][0], previous + dropped)  # then added, then normalised
            previous = seen[(i, f"norm_out{k}")][0]


@pytest.mark.parametrize("copies", [1, 16])  # batch 2 or 32: on a CPU, attention through SDPA or the explicit path
@pytest.mark.parametrize("site", ["p_drop_attn", "p_drop_relu"])
def test_attention_and_relu_dropout_act_when_set(site, copies):
    """model.p_drop_attn and model.p_drop_relu (0 in the paper's code, A4; options here) drop the attention
    weights and the FFN's hidden units in training: set alone, each makes a training forward differ from the
    evaluation one; an option that is read but not applied would leave them equal. On a CPU a batch of 32
    takes attention's explicit path (``attention``: batch x heads x queries > 64), training's; 2 takes SDPA."""
    src, tgt_in = torch.tensor([[5, 6, 7, 1], [8, 1, 0, 0]]), torch.tensor([[0, 9, 10], [0, 11, 0]])
    src, tgt_in = src.repeat(copies, 1), tgt_in.repeat(copies, 1)
    model = tiny_model(cfg=dataclasses.replace(TINY, **{site: 0.5}))
    with torch.no_grad():
        evaluated = model(src, tgt_in)
        torch.manual_seed(1)
        trained = model.train()(src, tgt_in)
    assert not torch.allclose(trained, evaluated)
    off = tiny_model(cfg=TINY).train()  # and with every rate 0, training's forward is evaluation's
    with torch.no_grad():
        torch.testing.assert_close(off(src, tgt_in), off.eval()(src, tgt_in))


def test_a_compiled_training_forward_is_one_graph_with_dropout_on():
    """torch.compile (train.compile) traces training's forward pass as one graph, dropout included (the
    CPU's mask from random words broke it at every layer, and each break compiled again). The target
    positions are selected after it, by indices made on the host (``Batch.positions``: a boolean mask's
    selection has a size only the data tells, and on a GPU a wait for the device)."""
    torch.manual_seed(0)
    model = Transformer(load_config("tiny").model, 50).train()
    assert model.cfg.p_drop > 0
    batch = collate([Example([5, 6, 7, 2], [8, 9, 2]), Example([5, 2], [8, 9, 10, 11, 2])], [0, 1])
    explained = torch._dynamo.explain(model)(batch.src, batch.tgt_in, logits=False)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


def test_training_selects_the_same_positions_as_a_mask_with_the_same_gradients():
    """Batch.positions (indices into the flattened targets) pick what the non-PAD mask picks, in its
    order, and the gradients flowing back through the selection are the mask's, bit for bit."""
    torch.manual_seed(0)
    model = Transformer(load_config("tiny").model, 50).train()
    batch = collate([Example([5, 6, 7, 2], [8, 9, 2]), Example([5, 2], [8, 9, 10, 11, 2]),
                     Example([4, 2], [2])], [0, 1, 2])
    keep = batch.tgt_out != PAD_ID
    assert batch.positions.tolist() == keep.flatten().nonzero().squeeze(1).tolist()
    assert batch.positions.numel() == batch.n_tgt_tokens == 9
    hidden = model.decode(batch.tgt_in, *model.encode(batch.src)).detach().requires_grad_(True)
    picked = hidden.flatten(0, 1).index_select(0, batch.positions)
    assert torch.equal(picked, hidden[keep])
    upstream = torch.randn_like(picked)
    (by_index,) = torch.autograd.grad(picked, hidden, upstream)
    (by_mask,) = torch.autograd.grad(hidden[keep], hidden, upstream)
    assert torch.equal(by_index, by_mask)


def test_multi_head_attention_matches_torch_reference():
    """Against torch.nn.MultiheadAttention (an independent implementation of §3.2.2)."""
    torch.manual_seed(2)
    d, h = 16, 4
    ours = MultiHeadAttention(d, h, d // h, d // h, 0.0, bias=True)
    ref = nn.MultiheadAttention(d, h, bias=True, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    x, mem = torch.randn(2, 3, d), torch.randn(2, 6, d)
    keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    expected, _ = ref(x, mem, mem, key_padding_mask=~keep)
    got = ours(x, *ours.project_kv(mem), mask=keep[:, None, None, :])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_fused_projections_equal_the_separate_ones_with_their_gradients():
    """Training projects Q, K, V (and cross-attention's K, V) as one matmul; inference one by one."""
    torch.manual_seed(4)
    mha = MultiHeadAttention(8, 2, 3, 5, 0.0, bias=True)
    x = torch.randn(2, 4, 8)
    fused = mha.project_qkv(x)  # gradients enabled: the weights concatenated
    with torch.no_grad():
        separate = mha.project_qkv(x)
    for got, expected in zip(fused, separate):
        torch.testing.assert_close(got, expected)
    # each weight receives the gradient its own projection would give it
    upstream = [torch.randn(2, 2, 4, d) for d in (3, 3, 5)]
    sum((t * u).sum() for t, u in zip(fused, upstream)).backward()
    fused_grads = [(m.weight.grad.clone(), m.bias.grad.clone()) for m in (mha.q_proj, mha.k_proj, mha.v_proj)]
    mha.zero_grad()
    for m, u, d in zip((mha.q_proj, mha.k_proj, mha.v_proj), upstream, (3, 3, 5)):
        (mha.split_heads(m(x), d) * u).sum().backward()
    for m, (w, b) in zip((mha.q_proj, mha.k_proj, mha.v_proj), fused_grads):
        torch.testing.assert_close(w, m.weight.grad)
        torch.testing.assert_close(b, m.bias.grad)
    k, v = mha.project_kv(x)
    torch.testing.assert_close(k, separate[1])
    torch.testing.assert_close(v, separate[2])


def test_positional_encoding_equals_section_3_5_formulas():
    d = 16
    pe = sinusoidal_positions(50, d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / d)), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / d)), abs=1e-6)
    torch.testing.assert_close(sinusoidal_positions(5, d, offset=45), pe[45:50])


def test_model_positions_grow_past_any_table_size():
    model = tiny_model()
    for offset, length in ((0, 3), (510, 5), (1500, 2), (7, 1)):  # past the first table, then back
        torch.testing.assert_close(model.positions(length, offset, "tgt_pos", torch.device("cpu")),
                                   sinusoidal_positions(length, model.cfg.d_model, offset), rtol=0, atol=0)
    assert "_sinusoids" not in model.state_dict()


def test_decoder_position_i_ignores_later_tokens():
    model = tiny_model()
    src = torch.tensor([[5, 6, 7, 8, 1]])
    tgt = torch.tensor([[PAD_ID, 9, 10, 11, 12]])
    changed = tgt.clone()
    changed[0, 3:] = torch.tensor([30, 31])
    a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert not torch.allclose(a[:, 3:], b[:, 3:])


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])  # learned: Table 3 row (E), a table per side
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_cached_decoding_equals_full_decoding(norm, positional):
    model = tiny_model(cfg=dataclasses.replace(TINY, norm=norm, positional=positional))
    src = torch.tensor([[5, 6, 7, 8, 1], [9, 10, 1, PAD_ID, PAD_ID]])
    tgt = torch.tensor([[PAD_ID, 11, 12, 13], [PAD_ID, 14, 15, 16]])
    full = model(src, tgt)
    memory, mask = model.encode(src)
    cache = model.init_cache(memory, mask, max_len=tgt.size(1))
    steps = torch.stack([model.decode_step(tgt[:, i], cache) for i in range(tgt.size(1))], 1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_cached_decoding_with_beams_and_unequal_head_sizes(norm):
    """The step's folded cross-attention (a sentence's beams as queries of one source) and its Q/K/V
    split hold for beam rows and for d_k != d_v (Table 3 rows A, B)."""
    model = tiny_model(cfg=dataclasses.replace(TINY, norm=norm, d_k=8, d_v=4))
    src = torch.tensor([[5, 6, 7, 8, 1], [9, 10, 1, PAD_ID, PAD_ID]])
    tgt = torch.tensor([[PAD_ID, 11, 12, 13], [PAD_ID, 17, 18, 19], [PAD_ID, 14, 15, 16], [PAD_ID, 20, 21, 22]])
    full = model(src.repeat_interleave(2, 0), tgt)
    memory, mask = model.encode(src)
    cache = model.init_cache(memory, mask, beam=2, max_len=tgt.size(1))
    steps = torch.stack([model.decode_step(tgt[:, i], cache) for i in range(tgt.size(1))], 1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_a_packed_models_step_weights_keep_their_packed_copies():
    """``pack_for_inference``'s oneDNN copies reach the step: a kept step weight without one (the fused
    Q/K/V, or a copy of a layer's weight) would make oneDNN reorder the weight at every product, which at
    batch 1 cost more than the product. Rows enough for oneDNN: the packed step equals the full model."""
    model = tiny_model(cfg=dataclasses.replace(TINY, d_model=64, d_ff=256))
    src = torch.tensor([[5, 6, 7, 8, 1], [9, 10, 1, PAD_ID, PAD_ID]])
    tgt = torch.randint(3, 50, (64, 4))
    tgt[:, 0] = PAD_ID
    full = model(src.repeat_interleave(32, 0), tgt)
    pack_for_inference(model)
    model.keep_step_weights()
    packed = hasattr(model.decoder[0].ffn.w1.weight, "_onednn")
    assert packed == _ONEDNN
    for w in model._step_weights:
        for weight, _ in (w.qkv, w.self_out, w.cross_q, w.cross_out, w.w1, w.w2):
            assert hasattr(weight, "_onednn") == packed
    memory, mask = model.encode(src)
    cache = model.init_cache(memory, mask, beam=32, max_len=tgt.size(1))
    with torch.inference_mode():
        steps = torch.stack([model.decode_step(tgt[:, i], cache) for i in range(tgt.size(1))], 1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_source_padding_changes_nothing():
    model = tiny_model()
    src = torch.tensor([[5, 6, 7, 1]])
    padded = torch.tensor([[5, 6, 7, 1, PAD_ID, PAD_ID]])
    tgt = torch.tensor([[PAD_ID, 11, 12]])
    torch.testing.assert_close(model(src, tgt), model(padded, tgt), atol=1e-5, rtol=1e-5)


def test_embeddings_scaled_and_shared_three_ways():
    model = tiny_model()
    tokens = torch.tensor([[3, PAD_ID]])
    emb = model.source_embedding(tokens)
    torch.testing.assert_close(emb[0, 0], model.embed.weight[3] * math.sqrt(TINY.d_model))  # §3.4
    assert torch.all(emb[0, 1] == 0)  # PAD (and the start symbol) is the zero vector
    assert model.source_embedding is model.target_embedding
    hidden = torch.randn(3, TINY.d_model)
    torch.testing.assert_close(model.project(hidden), hidden @ model.embed.weight.T)


def test_attention_weights_are_recorded_and_match_output():
    model = tiny_model()
    src = torch.tensor([[5, 6, 7, 1, PAD_ID]])
    tgt = torch.tensor([[PAD_ID, 11, 12]])
    plain = model(src, tgt)
    with record_attention(model) as rec:
        recorded = model(src, tgt)
    torch.testing.assert_close(recorded, plain, atol=1e-5, rtol=1e-5)
    assert len(rec["enc_self"]) == 2 and rec["cross"][0][0].shape == (1, 4, 3, 5)
    assert torch.all(rec["cross"][1][0][..., 4] == 0)  # the PAD key
    assert torch.all(rec["dec_self"][0][0][..., 0, 1:] == 0)  # causal
    assert all(m.record is None for m in model.modules() if isinstance(m, MultiHeadAttention))


def test_module_names_are_the_checkpoint_format():
    names = set(tiny_model().state_dict())
    expected = {"embed.weight", "encoder.0.self_attn.q_proj.weight", "encoder.0.self_attn.out_proj.bias",
                "encoder.1.ffn.w1.weight", "encoder.1.ffn.w2.bias", "encoder.0.norm2.weight",
                "decoder.1.cross_attn.k_proj.weight", "decoder.0.self_attn.v_proj.weight",
                "decoder.0.norm3.bias", "decoder.1.ffn.w2.weight"}
    assert expected <= names
    assert not any("output_proj" in n or "src_embed" in n for n in names)
    untied = ModelConfig(**{**TINY.__dict__, "share_embeddings": False, "share_output": False})
    names = set(tiny_model(cfg=untied).state_dict())
    assert {"src_embed.weight", "tgt_embed.weight", "output_proj.weight"} <= names


def test_initialisation():
    model = tiny_model(cfg=ModelConfig(d_model=256, d_ff=512, n_heads=4, n_enc_layers=1, n_dec_layers=1), vocab=4000)
    assert model.embed.weight.std().item() == pytest.approx(256**-0.5, rel=0.05)  # N(0, d^-0.5), A8
    w = model.encoder[0].ffn.w1.weight
    assert w.abs().max().item() <= math.sqrt(6 / (256 + 512)) + 1e-6  # Xavier uniform
    assert torch.all(model.encoder[0].self_attn.q_proj.bias == 0)
    assert model.encoder[0].norm1.eps == 1e-6  # A7
    untied = tiny_model(cfg=ModelConfig(d_model=256, d_ff=512, n_heads=4, n_enc_layers=1, n_dec_layers=1,
                                        share_embeddings=False, share_output=False), vocab=4000)
    for weight in (untied.src_embed.weight, untied.tgt_embed.weight, untied.output_proj.weight):  # A8: the
        assert weight.std().item() == pytest.approx(256**-0.5, rel=0.05)  # softmax matrix too (it was Xavier's)


def test_every_linear_layer_is_xavier_uniform_and_every_layer_norm_the_authors():
    """A8: every linear weight (attention q/k/v/o, both FFN layers, in every layer of both stacks) is drawn
    Xavier-uniform, U(-b, b) with b = sqrt(6 / (fan_in + fan_out)), biases zero; A7: every LayerNorm has
    ε 1e-6, γ 1 and β 0. The bound is held from both sides: a smaller draw (PyTorch's default
    kaiming_uniform(a=√5), bound 1/sqrt(fan_in), or a gain below 1) stays under the upper bound alone."""
    cfg = ModelConfig(d_model=256, d_ff=512, n_heads=4, n_enc_layers=2, n_dec_layers=2)
    model = tiny_model(cfg=cfg, vocab=100)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 2 * (4 + 2) + 2 * (8 + 2)  # enc: self-attn 4 + FFN 2; dec: two attentions 8 + FFN 2
    for name, m in linears:
        fan_out, fan_in = m.weight.shape
        bound = math.sqrt(6 / (fan_in + fan_out))
        w = m.weight.detach()
        assert w.abs().max().item() <= bound + 1e-6, name
        assert w.abs().max().item() > 0.98 * bound, name  # 65k+ uniform draws reach the bound's last 2%
        assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05), name  # uniform's variance b²/3
        assert m.bias is None or torch.all(m.bias == 0), name
    norms = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 2 * 2 + 2 * 3  # post-norm: 2 per encoder layer, 3 per decoder layer, no final one
    for name, m in norms:
        assert m.eps == 1e-6, name
        assert torch.all(m.weight == 1) and torch.all(m.bias == 0), name


def test_qkv_gain_scales_only_the_query_key_and_value_draws():
    """train.init_qkv_gain (A8): 1/√2 gives q, k and v the Xavier bound of a third of a fused [d, 3d]
    kernel, sqrt(6 / 4d), from the same draws, in every attention as fairseq draws them; every other weight is
    drawn as at gain 1."""
    cfg = ModelConfig(d_model=256, d_ff=512, n_heads=4, n_enc_layers=1, n_dec_layers=1)
    torch.manual_seed(0)
    plain = Transformer(cfg, 100).state_dict()
    torch.manual_seed(0)
    scaled = Transformer(cfg, 100, qkv_gain=2**-0.5).state_dict()
    qkv = [n for n in plain if n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight"))]
    assert len(qkv) == 3 * 3  # encoder self, decoder self and cross attention
    for name in qkv:
        torch.testing.assert_close(scaled[name], plain[name] * 2**-0.5)
        assert scaled[name].abs().max().item() <= math.sqrt(6 / (4 * 256)) + 1e-6
        assert scaled[name].abs().max().item() > 0.9 * math.sqrt(6 / (4 * 256))
    for name in plain.keys() - set(qkv):
        assert torch.equal(scaled[name], plain[name]), name


def test_learned_positions_row_e():
    cfg = ModelConfig(**{**TINY.__dict__, "positional": "learned", "max_positions": 8})
    model = tiny_model(cfg=cfg)
    assert model.src_pos.weight.shape == (8, TINY.d_model)
    wide = tiny_model(cfg=dataclasses.replace(cfg, d_model=256, max_positions=64))  # drawn as the embeddings (A8)
    for table in (wide.src_pos.weight, wide.tgt_pos.weight):
        assert table.std().item() == pytest.approx(256**-0.5, rel=0.1)
    assert not torch.equal(wide.src_pos.weight, wide.tgt_pos.weight)  # two tables, drawn apart
    model(torch.tensor([[5, 6, 1]]), torch.tensor([[PAD_ID, 7]]))
    with pytest.raises(PositionsError, match="max_positions = 8"):
        model(torch.tensor([[5] * 9]), torch.tensor([[PAD_ID]]))


def params(preset: str, vocab: int) -> int:
    cfg = load_config(preset)
    with torch.device("meta"):
        return count_parameters(Transformer(cfg.model, vocab))


def test_parameter_counts_match_the_paper():
    """Table 3 params (×10^6) at the authors' 40,960-row vocabulary, to the printed precision (half a million:
    learned positions alone would add 1.05M); big at 37,000 within 1% (A15: 214.2M where the table prints 213)."""
    assert params("big", 37000) == pytest.approx(213e6, rel=0.01)
    printed = {"base": 65, "B1": 58, "B2": 60, "C1": 36, "C2": 50, "C3": 80, "C4": 28, "C5": 168, "C6": 53, "C7": 90}
    for row, millions in printed.items():
        assert abs(params(row, 40960) - millions * 1e6) <= 0.5e6, row
    # E prints no count (the base's 65): A15's table of 256 rows a side comes out so; the preset's 1024 (PAPER_MAP)
    cfg = load_config("E", ["model.max_positions=256"])
    with torch.device("meta"):
        assert abs(count_parameters(Transformer(cfg.model, 40960)) - 65e6) <= 0.5e6
    assert params("E", 40960) - params("base", 40960) == 2 * 1024 * 512


@pytest.mark.parametrize("norm, stream", [("post", torch.bfloat16), ("pre", torch.float32)])
def test_the_post_norm_stream_keeps_autocasts_dtype(norm, stream):
    """Under bf16 autocast a post-norm model's residual stream is bf16 from the embeddings' sum on: every
    layer's output and the decoder's, which the loss projects. Pre-norm's un-normalised stream keeps fp32.
    Outside autocast the stream is fp32, and the LayerNorms' gains still get fp32 gradients."""
    model = tiny_model(cfg=dataclasses.replace(TINY, norm=norm))
    src, tgt = torch.tensor([[5, 6, 7, 1], [8, 9, 1, 0]]), torch.tensor([[2, 5, 6], [2, 7, 0]])
    seen: list[torch.dtype] = []
    hooks = [m.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
             for m in [*model.encoder, *model.decoder]]
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = model(src, tgt, logits=False)
        assert set(seen) == {stream} and len(seen) == 4 and hidden.dtype == stream
        hidden.float().square().sum().backward()
        norm1 = model.encoder[0].norm1
        assert norm1.weight.grad.dtype == torch.float32 and norm1.weight.grad.abs().sum() > 0
        seen.clear()
        assert model(src, tgt, logits=False).dtype == torch.float32 and set(seen) == {torch.float32}
    finally:
        for h in hooks:
            h.remove()


def test_pre_norm_layers_by_hand():
    """model.norm = "pre" (DEVIATION(§3.1), A0): x + Sublayer(LayerNorm(x)) per sub-layer, and a
    final LayerNorm per stack; "post" is LayerNorm(x + Sublayer(x)) (§3.1)."""
    pre = tiny_model(cfg=dataclasses.replace(TINY, norm="pre"))
    src = torch.tensor([[5, 6, 7, 1]])
    x = pre.source_embedding(src) + pre.positions(4, 0, "src_pos", src.device)
    mask = padding_mask(src)
    for layer in pre.encoder:
        h = layer.norm1(x)
        x = x + layer.self_attn(h, *layer.self_attn.project_kv(h), mask=mask)
        x = x + layer.ffn(layer.norm2(x))
    memory, _ = pre.encode(src)
    torch.testing.assert_close(memory, pre.enc_norm(x))
    post = tiny_model()
    assert not hasattr(post, "enc_norm") and not hasattr(post, "dec_norm")
    x = post.source_embedding(src) + post.positions(4, 0, "src_pos", src.device)
    for layer in post.encoder:
        x = layer.norm1(x + layer.self_attn(x, *layer.self_attn.project_kv(x), mask=mask))
        x = layer.norm2(x + layer.ffn(x))
    torch.testing.assert_close(post.encode(src)[0], x)


def test_evaluation_drops_nothing_at_any_dropout_rate():
    """A model in evaluation mode (decoding, validation) applies none of its dropout rates, the attention
    weights' included: with every rate 0.5 its forward is that of the same weights with every rate 0. (A rate
    applied at evaluation makes the output random; two forwards in training mode differ anyway, so the test
    that training drops cannot tell.)"""
    src, tgt_in = torch.tensor([[5, 6, 7, 1], [8, 1, 0, 0]]), torch.tensor([[0, 9, 10], [0, 11, 0]])
    dropped = tiny_model(cfg=dataclasses.replace(TINY, p_drop=0.5, p_drop_attn=0.5, p_drop_relu=0.5))
    plain = tiny_model(cfg=TINY)
    with torch.no_grad():
        torch.testing.assert_close(dropped(src, tgt_in), plain(src, tgt_in))
        with record_attention(dropped):  # the explicit path (weights asked for) as well as the fused one
            torch.testing.assert_close(dropped(src, tgt_in), plain(src, tgt_in))


def test_a_first_sequence_longer_than_the_first_sinusoid_table_gets_all_its_positions():
    """The sinusoid table starts at 512 rows and grows on demand: a first sentence of 600 tokens, or a jump past
    twice the table, is given every position it asks for (a table only doubled would return too few rows)."""
    cpu = torch.device("cpu")
    model = tiny_model()
    torch.testing.assert_close(model.positions(600, 0, "src_pos", cpu), sinusoidal_positions(600, 32),
                               rtol=0, atol=0)
    torch.testing.assert_close(model.positions(2, 3000, "tgt_pos", cpu), sinusoidal_positions(2, 32, 3000),
                               rtol=0, atol=0)


def test_flops_per_token_counts_the_forward_products_three_times():
    """flops_per_token is 3 × the forward pass's matmul FLOPs per target token, the output projection's
    included: counted here by PyTorch's FLOP counter on a forward of one source and one target of the same
    length (the explicit attention path: QKᵀ and AV over every key), with gradients on (F.linear throughout)."""
    from torch.utils.flop_counter import FlopCounterMode

    from transformer.model import flops_per_token

    cfg, vocab, length = dataclasses.replace(TINY, d_ff=48, n_enc_layers=1, n_dec_layers=2), 50, 20
    model = tiny_model(cfg=cfg, vocab=vocab)
    src, tgt_in = torch.randint(3, vocab, (1, length)), torch.randint(3, vocab, (1, length))
    with FlopCounterMode(display=False) as counter:
        model(src, tgt_in)
    assert flops_per_token(cfg, vocab, length, length) == pytest.approx(3 * counter.get_total_flops() / length)
    # a shorter source: the encoder's self-attention and the decoder's cross-attention attend over fewer keys,
    # 2·h·(d_k + d_v) FLOPs a key for each query, forward, three times in training; the rest is per token
    d_k, d_v = cfg.head_dims
    fewer = 3 * (cfg.n_enc_layers + cfg.n_dec_layers) * 2 * (length - 5) * cfg.n_heads * (d_k + d_v)
    assert flops_per_token(cfg, vocab, length, length) - flops_per_token(cfg, vocab, 5, length) == pytest.approx(fewer)


def test_a_stop_signal_during_a_meta_build_waits_for_its_end(monkeypatch):
    """The first build on the meta device imports torch._dynamo and triton: Ctrl-C inside triton's bindings
    aborted the process (exit 134, a C++ exception) or was lost, and training went on to its end."""
    import os
    import signal

    from transformer.model import on_meta

    class Stopped(Exception):
        pass

    def stop(signum, frame):
        raise Stopped

    built, original = [], Transformer.__init__

    def interrupted(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # inside the held block: acted on once the build is done
        original(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(Transformer, "__init__", interrupted)
    previous = signal.signal(signal.SIGINT, stop)
    try:
        with pytest.raises(Stopped):
            on_meta(load_config("tiny").model, 100)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(built) == 1  # built whole, then stopped
