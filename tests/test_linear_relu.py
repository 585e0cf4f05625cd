"""benchmarks/linear_relu.py, the feed-forward layer's max(0, x W1ᵀ + b1) with the ReLU in the product's
epilogue (a candidate for issue 47), held to the operators it replaces, on the CPU: the same values and
gradients, and, compiled, the one fused call Inductor keeps (on a GPU: cuBLASLt's ReLU-and-bias epilogue)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu  # noqa: E402
from linear_relu import linear_relu  # noqa: E402


def operands(dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 16, generator=g, dtype=dtype, requires_grad=True)  # [sentences, length, d_model]
    w = torch.randn(24, 16, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(24, generator=g, dtype=dtype, requires_grad=True)
    return x, w, b


def gradients(y: torch.Tensor, leaves, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(y, leaves, dy)


def test_it_is_relu_of_the_linear_layer_with_the_same_gradients():
    x, w, b = operands()
    want = F.relu(F.linear(x, w, b))
    got = linear_relu(x, w, b)
    assert got.shape == want.shape == (3, 7, 24) and (want == 0).any() and (want > 0).any()
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    dy = torch.randn_like(want)
    for a, e in zip(gradients(got, (x, w, b), dy), gradients(want, (x, w, b), dy)):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)


def test_under_autocast_it_computes_in_its_dtype_and_the_fp32_weights_get_their_gradients():
    """As the trainer runs it: fp32 leaves, bf16 autocast; the output bits are the operators' (the ReLU commutes
    with the rounding) and the gradients reach the fp32 weights through autograd's casts."""
    x, w, b = operands()
    with torch.autocast("cpu", torch.bfloat16):
        want = F.relu(F.linear(x, w, b))
        got = linear_relu(x, w, b)
    assert got.dtype == want.dtype == torch.bfloat16
    assert torch.equal(got, want)
    dy = torch.randn_like(want)
    for a, e in zip(gradients(got, (x, w, b), dy), gradients(want, (x, w, b), dy)):
        assert a.dtype == e.dtype == torch.float32
        torch.testing.assert_close(a, e, atol=2e-2, rtol=1e-2)


def test_compiled_the_forward_launches_no_kernel_for_the_relu():
    """What torch.compile makes of a feed-forward network (eq. 2) through it: Inductor keeps
    ``_addmm_activation`` as the call it is (on a GPU one cuBLASLt product whose epilogue adds the bias and applies
    the ReLU), so the forward is the two products and nothing else, where through the operators it is the
    products and a kernel that applies the ReLU and stores its mask (one a layer, on the H200 too). The backward
    takes the ReLU's gradient from the layer's output, which the second product's gradient keeps anyway. Same
    values and gradients."""
    x, w, b = operands()
    g = torch.Generator().manual_seed(1)
    w2, b2 = torch.randn(16, 24, generator=g, requires_grad=True), torch.randn(16, generator=g, requires_grad=True)
    dy = torch.randn(3, 7, 16)
    leaves = (x, w, b, w2, b2)

    def compiled_step(first_layer):
        torch._dynamo.reset()
        ffn = torch.compile(lambda x, w, b: F.linear(first_layer(x, w, b), w2, b2), dynamic=True)

        def step():
            y = ffn(x, w, b)
            return y, gradients(y, leaves, dy)

        (y, grads), (forward, _) = run_and_get_code(step)
        return y, grads, forward

    y, grads, forward = compiled_step(linear_relu)
    want, want_grads, operators_forward = compiled_step(lambda x, w, b: F.relu(F.linear(x, w, b)))
    assert "_addmm_activation" in forward and "_addmm_activation" not in operators_forward
    kernels = 'extern "C"'  # a kernel Inductor generates for the CPU
    assert forward.count(kernels) == 0 and operators_forward.count(kernels) == 1
    torch.testing.assert_close(y, want, atol=1e-6, rtol=1e-6)
    for a, e in zip(grads, want_grads):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_a_models_training_step_through_the_epilogue(monkeypatch, dtype):
    """gpu.py's epilogue rows (``gpu.ffn_through_epilogue``, here on the CPU): every feed-forward layer's first
    product goes through it, nothing else does, and the step's loss and gradients are the operators' (fp32), or
    within bf16's rounding through the stack (bf16 autocast, as the trainer's GPU rows run)."""
    import linear_relu as module

    from transformer.config import load_config
    from transformer.data import Example, collate
    from transformer.model import Transformer
    from transformer.train import batch_loss

    monkeypatch.setattr(gpu, "EPILOGUE_DEVICES", ("cuda", "cpu"))
    calls = []
    monkeypatch.setattr(module, "linear_relu", lambda *a: calls.append(a[1].shape) or linear_relu(*a))
    cfg = load_config("tiny")
    torch.manual_seed(0)
    model = Transformer(dataclasses.replace(cfg.model, p_drop=0.0), 50)
    g = torch.Generator().manual_seed(3)
    examples = [Example(torch.randint(3, 50, (n,), generator=g).tolist(),
                        torch.randint(3, 50, (n + 2,), generator=g).tolist()) for n in (5, 9, 7)]
    batch = collate(examples, [0, 1, 2])

    def step(through: bool) -> tuple[float, dict[str, torch.Tensor]]:
        model.zero_grad()
        autocast = torch.autocast("cpu", dtype) if dtype else torch.autocast("cpu", enabled=False)
        with gpu.ffn_through_epilogue(through), autocast:
            loss = batch_loss(model, batch, 0.1)
        loss.backward()
        return loss.item(), {name: q.grad.clone() for name, q in model.named_parameters()}

    want_loss, want = step(False)
    assert not calls
    got_loss, got = step(True)
    m = cfg.model
    assert calls == [(m.d_ff, m.d_model)] * (m.n_enc_layers + m.n_dec_layers)
    assert got_loss == pytest.approx(want_loss, rel=1e-6 if dtype is None else 1e-2)
    for name, a in got.items():
        if dtype is None:
            torch.testing.assert_close(a, want[name], atol=1e-5, rtol=1e-4)
        elif not name.endswith("k_proj.bias"):  # zero in exact arithmetic: both are rounding, and unalike
            assert F.cosine_similarity(a.flatten(), want[name].flatten(), dim=0) > 0.97, name
