"""eq. (3) and label smoothing (§5.3, §5.4) against hand computations."""

import math

import pytest
import torch

from transformer import loss as loss_module
from transformer.loss import label_smoothed_loss
from transformer.config import TrainConfig
from transformer.optim import cooldown, learning_rate, make_optimizer


@pytest.mark.parametrize("step", [1, 4000, 100000])
def test_learning_rate_equals_equation_3(step):
    d, w = 512, 4000
    expected = d**-0.5 * min(step**-0.5, step * w**-1.5)
    assert learning_rate(step, d, w) == pytest.approx(expected, rel=1e-12)


def test_learning_rate_values():
    assert learning_rate(4000, 512, 4000) == pytest.approx(6.988e-4, rel=1e-3)  # the peak, A1
    assert learning_rate(1, 512, 4000) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert learning_rate(100000, 512, 4000) == pytest.approx(512**-0.5 * 100000**-0.5)
    assert learning_rate(2000, 512, 4000, scale=2.0) == pytest.approx(2 * learning_rate(2000, 512, 4000))


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothing_equals_brute_force_cross_entropy(eps):
    torch.manual_seed(0)
    n, v = 5, 7
    logits, target = torch.randn(n, v), torch.randint(0, v, (n,))
    loss = label_smoothed_loss(logits, torch.eye(v), target, eps)  # hidden = logits, projection = identity
    lp = torch.log_softmax(logits, -1)
    expected, expected_kl = 0.0, 0.0
    for i in range(n):
        q = [1 - eps if c == target[i] else eps / (v - 1) for c in range(v)]  # ε/(V-1) elsewhere, A3
        expected += -sum(q[c] * lp[i, c].item() for c in range(v))
        expected_kl += sum(q[c] * (math.log(q[c]) - lp[i, c].item()) for c in range(v) if q[c] > 0)
    entropy = -sum(q * math.log(q) for q in [1 - eps] + [eps / (v - 1)] * (v - 1) if q > 0)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert loss.item() - n * entropy == pytest.approx(expected_kl, rel=1e-4, abs=1e-5)  # KL + constant
    nll = label_smoothed_loss(logits, torch.eye(v), target, 0.0)
    assert nll.item() == pytest.approx(-lp[torch.arange(n), target].sum().item(), rel=1e-6)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("block_rows", [1, 4, 100])
def test_label_smoothing_gradient_matches_autograd_reference(eps, block_rows, monkeypatch):
    """The hand-written gradients, through the projection and in blocks of rows, against autograd
    through PyTorch's own cross-entropy of the projected logits."""
    import transformer.loss as L

    monkeypatch.setattr(L, "_CPU_BLOCK_BYTES", 4 * 11 * block_rows)  # V = 11: block_rows rows per block
    torch.manual_seed(1)
    n, d, v = 9, 5, 11
    hidden, weight = torch.randn(n, d, requires_grad=True), torch.randn(v, d, requires_grad=True)
    target = torch.randint(0, v, (n,))
    loss = label_smoothed_loss(hidden, weight, target, eps)
    (2.0 * loss).backward()
    ours = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ref = torch.nn.functional.cross_entropy(hidden @ weight.T, target, reduction="sum",
                                            label_smoothing=eps * v / (v - 1))
    (2.0 * ref).backward()
    torch.testing.assert_close(ours, (hidden.grad, weight.grad))
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    with torch.no_grad():  # validation: the same value, no gradient work
        assert label_smoothed_loss(hidden, weight, target, eps).item() == pytest.approx(ref.item(), rel=1e-5)


def _loss_casting_twice(hidden, weight, target, eps):
    """The loss as it was before the gradient was cast once (issue 47): its fp32 log-softmax of an
    fp32 copy of the logits, and a gradient each product casts again under autocast."""
    v = weight.size(0)
    eps_i, on_target = eps / (v - 1), 1.0 - eps - eps / (v - 1)
    log_probs = (hidden @ weight.T).to(torch.float32).log_softmax(-1)
    total = -(on_target * log_probs.gather(-1, target[:, None]).sum() + eps_i * log_probs.sum())
    grad = log_probs.exp_().sub_(eps_i)
    grad.scatter_add_(-1, target[:, None], torch.full((len(target), 1), -on_target))
    return total, grad.to(weight.dtype) @ weight, grad.T.to(hidden.dtype) @ hidden


@pytest.mark.parametrize("hidden_dtype", [torch.float32, torch.bfloat16])  # post-norm's fp32 LayerNorm output, or bf16
def test_label_smoothing_under_autocast_equals_casting_twice(hidden_dtype):
    """Under bf16 autocast the gradient is cast to bf16 once for both of its products: the same loss
    and gradients, bit for bit, as when each product cast it (the products' operands are the same)."""
    torch.manual_seed(3)
    hidden = torch.randn(6, 8).to(hidden_dtype).requires_grad_()
    weight = torch.randn(13, 8, requires_grad=True)
    target = torch.randint(0, 13, (6,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = label_smoothed_loss(hidden, weight, target, 0.1)
        loss.backward()
        with torch.no_grad():
            want_loss, want_hidden, want_weight = _loss_casting_twice(hidden, weight, target, 0.1)
    assert torch.equal(loss.detach(), want_loss)
    assert torch.equal(hidden.grad, want_hidden.to(hidden.grad.dtype))
    assert torch.equal(weight.grad, want_weight.to(weight.grad.dtype))


def test_label_smoothing_under_autocast_casts_the_weight_once(monkeypatch):
    """Block by block under bf16 autocast, the [V, D] weight is cast to bf16 once for every block's
    logits and both gradient products, not once a block (autocast caches casts of the weight, not of
    the view weight.T that each block's logits read)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Casts(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.shapes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default:
                self.shapes.append(tuple(args[0].shape))
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(loss_module, "_CPU_BLOCK_BYTES", 4 * 13 * 2)  # 2 rows a block: 3 blocks
    torch.manual_seed(3)
    hidden = torch.randn(6, 8, requires_grad=True)
    weight = torch.randn(13, 8, requires_grad=True)
    target = torch.randint(0, 13, (6,))
    with torch.autocast("cpu", dtype=torch.bfloat16), Casts() as casts:
        label_smoothed_loss(hidden, weight, target, 0.1).backward()
    assert casts.shapes.count((13, 8)) + casts.shapes.count((8, 13)) == 1


def test_label_smoothing_gradient_passes_gradcheck_in_float64():
    """Finite differences in float64: the loss keeps its inputs' precision (fp32 at least)."""
    torch.manual_seed(2)
    hidden = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 6, (7,))
    assert label_smoothed_loss(hidden, weight, target, 0.1).dtype == torch.float64
    assert torch.autograd.gradcheck(lambda h, w: label_smoothed_loss(h, w, target, 0.1), (hidden, weight))


def test_cooldown_is_linear_to_zero_over_the_last_fraction():
    assert cooldown(0.3, 0.0) == 1.0  # off: eq. (3) unchanged
    assert cooldown(0.5, 0.4) == 1.0
    assert cooldown(0.6, 0.4) == pytest.approx(1.0)
    assert cooldown(0.8, 0.4) == pytest.approx(0.5)
    assert cooldown(1.0, 0.4) == 0.0
    assert cooldown(1.2, 0.4) == 0.0


def test_label_smoothing_gives_the_weight_its_gradient_when_only_the_weight_asks_for_one():
    """A hidden state that needs no gradient (a frozen stack, a detached input) still trains the projection:
    the weight's gradient is autograd's through the projected logits."""
    torch.manual_seed(2)
    hidden, weight, target = torch.randn(6, 5), torch.randn(11, 5, requires_grad=True), torch.randint(0, 11, (6,))
    label_smoothed_loss(hidden, weight, target, 0.1).backward()
    ours, weight.grad = weight.grad.clone(), None
    torch.nn.functional.cross_entropy(hidden @ weight.T, target, reduction="sum",
                                      label_smoothing=0.1 * 11 / 10).backward()
    torch.testing.assert_close(ours, weight.grad)


def test_the_optimizer_takes_section_5_3s_adam_settings_from_the_config():
    """make_optimizer: Adam with the config's β1, β2, ε (0.9, 0.98, 1e-9 by default, §5.3) and weight decay;
    the rate is 0 until the trainer sets eq. (3)'s."""
    model = torch.nn.Linear(3, 2)
    group = make_optimizer(model, TrainConfig()).param_groups[0]
    assert (group["betas"], group["eps"], group["weight_decay"], group["lr"]) == ((0.9, 0.98), 1e-9, 0.0, 0.0)
    cfg = TrainConfig(beta1=0.8, beta2=0.9, adam_eps=1e-6, weight_decay=0.01)
    group = make_optimizer(model, cfg).param_groups[0]
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.8, 0.9), 1e-6, 0.01)
