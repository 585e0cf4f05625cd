"""The Triton label-smoothed cross-entropy (``transformer.fused_loss``) held to the PyTorch path.

Without a CUDA GPU the kernel runs under Triton's interpreter, which tests/conftest.py chooses before
Triton is first imported.
"""

import pytest
import torch

pytest.importorskip("triton", reason="Triton has no wheel here (scripts/setup.sh installs the [triton] extra on "
                    "Linux x86-64)")

from transformer import loss as loss_module  # noqa: E402
from transformer.fused_loss import smoothed_loss_and_grad_  # noqa: E402
from transformer.loss import label_smoothed_loss  # noqa: E402
from tests.conftest import compile_for_sm90  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def reference(logits: torch.Tensor, target: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's -Σ q log softmax and p - q, in float64 from the given values."""
    x = logits.double()
    v = x.size(1)
    q = torch.full_like(x, eps / (v - 1))
    q.scatter_(1, target[:, None], 1.0 - eps)
    return -(q * x.log_softmax(1)).sum(1), x.softmax(1) - q


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("v, block", [(100, 32), (100, 4096), (64, 64), (37, 8)])
def test_kernel_equals_reference_in_float32(eps, v, block):
    torch.manual_seed(v + block)
    logits = torch.randn(23, v, device=DEVICE) * 4
    target = torch.randint(0, v, (23,), device=DEVICE)
    want_loss, want_grad = reference(logits, target, eps)
    loss = smoothed_loss_and_grad_(logits, target, eps, block=block)  # logits now hold the gradient
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), want_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits.double(), want_grad, rtol=1e-5, atol=1e-6)


def test_kernel_reads_bf16_logits_and_writes_a_bf16_gradient():
    torch.manual_seed(0)
    logits = (torch.randn(17, 300, device=DEVICE) * 4).bfloat16()
    target = torch.randint(0, 300, (17,), device=DEVICE)
    want_loss, want_grad = reference(logits, target, 0.1)  # from the same bf16 values
    loss = smoothed_loss_and_grad_(logits, target, 0.1, block=128)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), want_loss, rtol=1e-5, atol=1e-5)  # fp32 sums: no bf16 rounding
    # the gradient rounded once to bf16: within one bf16 ulp of the exact value, plus fp32 noise (a GPU
    # rounds to nearest, half an ulp; Triton's interpreter truncates)
    assert ((logits.double() - want_grad).abs() <= want_grad.abs() * 2**-7 + 1e-7).all()


def test_an_fp16_gradient_mostly_subnormal_at_v_37000_costs_the_products_less_than_bf16s():
    """fp16 training (train.precision = "fp16") stores p - q in fp16 before the loss scale multiplies it: at
    the paper's V = 37,000 the smoothing's ε/(V-1) = 2.7e-6 lies below fp16's smallest normal number (6.1e-5),
    so nearly every entry of a row is a subnormal of a few bits. What reaches the weights is the two products
    of that gradient, d hidden = (p - q) W and d W = (p - q)ᵀ hidden: their error stays below 1e-3 relative,
    under bf16's (8 bits for every entry, the training default), whose loss curve on a GPU matched fp32's."""
    torch.manual_seed(4)
    v, d = 37_000, 64
    weight = torch.randn(v, d, device=DEVICE) * d**-0.5
    hidden = torch.randn(16, d, device=DEVICE) * 3
    target = torch.randint(0, v, (16,), device=DEVICE)
    errors = {}
    for dtype in (torch.float16, torch.bfloat16):
        logits = (hidden @ weight.T).to(dtype)
        _, want = reference(logits, target, 0.1)  # from the same rounded logits: only p - q's storage differs
        smoothed_loss_and_grad_(logits, target, 0.1)
        got = logits.double()
        if dtype == torch.float16:
            tiny = (got != 0) & (got.abs() < torch.finfo(torch.float16).tiny)
            assert tiny.double().mean() > 0.9  # the case in question: most entries subnormal
        errors[dtype] = [float((f(got) - f(want)).norm() / f(want).norm())
                         for f in (lambda g: g @ weight.double(), lambda g: g.T @ hidden.double())]
    assert all(e < 1e-3 for e in errors[torch.float16]), errors
    assert all(h < b for h, b in zip(errors[torch.float16], errors[torch.bfloat16])), errors


COMPILE_FOR_SM90 = """
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from transformer import fused_loss
kernel = fused_loss._smoothed_rows
names = kernel.arg_names
types = {"logits_ptr": "*bf16", "target_ptr": "*i64", "loss_ptr": "*fp32", "eps_i": "fp32", "on_target": "fp32"}
signature = {n: types.get(n, "constexpr" if n in ("BLOCK", "ALIGN") else "i32") for n in names}
constants = {"BLOCK": fused_loss.BLOCK}
if "ALIGN" in names:
    constants["ALIGN"] = fused_loss.alignment(37000, 37000)
# what the launcher tells the compiler: tensors torch allocated are 16-byte aligned; nothing of V or the
# row stride (37,000, or 37,000 / ALIGN: no multiple of 16)
attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ("logits_ptr", "target_ptr", "loss_ptr")}
try:
    compiled = triton.compile(ASTSource(kernel, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 8})
except RuntimeError as e:  # a Triton without its NVIDIA backend's tools (ptxas)
    print(json.dumps({"skip": str(e).splitlines()[0][:200]}))
    sys.exit()
print(json.dumps({"ptx": re.findall(r"(?:ld|st)\\.global(?:\\.\\w+)*", compiled.asm["ptx"])}))
"""


def test_the_kernel_compiled_for_a_gpu_moves_16_bytes_per_access_at_v_37000():
    """The kernel as a GPU's Triton compiles it (PTX for sm_90, an H100 or H200, made here without one), for
    what training gives it: bf16 logits [rows, 37,000], the row stride V. V is a multiple of 8, not of 16,
    and Triton's launcher tells the compiler only of integers that are multiples of 16: the logits must still
    be read and written 16 bytes (8 logits) per access, not 2 bytes (one logit) each. Compiled in a process
    of its own: this one runs Triton's interpreter."""
    found = compile_for_sm90(COMPILE_FOR_SM90)
    accesses = found["ptx"]
    loads, stores = [a for a in accesses if a.startswith("ld")], [a for a in accesses if a.startswith("st")]
    assert any(a.endswith(".v4.b32") for a in loads) and any(a.endswith(".v4.b32") for a in stores), accesses
    assert sum(a.endswith(".b16") for a in loads) <= 1, accesses  # the target's logit, read alone
    assert not any(a.endswith(".b16") for a in stores), accesses


def test_kernel_refuses_logits_whose_rows_are_not_contiguous():
    logits = torch.randn(40, 10, device=DEVICE).T  # [10, 40] with stride (1, 10)
    with pytest.raises(ValueError, match="contiguous"):
        smoothed_loss_and_grad_(logits, torch.zeros(10, dtype=torch.long, device=DEVICE), 0.1)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_fused_loss_equals_the_pytorch_path_with_its_gradients(eps, monkeypatch):
    monkeypatch.setattr(loss_module, "_CPU_BLOCK_BYTES", 4 * 50 * 7)  # blocks of 7 rows: several, the last short
    monkeypatch.setattr(loss_module, "_ACCELERATOR_BLOCK_BYTES", 4 * 50 * 7)
    torch.manual_seed(1)
    hidden = torch.randn(30, 16, device=DEVICE)
    weight = torch.randn(50, 16, device=DEVICE)
    target = torch.randint(0, 50, (30,), device=DEVICE)
    results = []
    for fused in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        total = label_smoothed_loss(h, w, target, eps, fused=fused)
        (3.0 * total).backward()
        results.append((total.detach(), h.grad, w.grad))
    for plain, fused in zip(*results):
        torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)


def test_fused_loss_under_bf16_autocast_is_close_to_the_pytorch_path():
    torch.manual_seed(2)
    hidden = torch.randn(40, 32, device=DEVICE).requires_grad_()
    weight = torch.randn(200, 32, device=DEVICE).requires_grad_()
    target = torch.randint(0, 200, (40,), device=DEVICE)
    results = []
    for fused in (False, True):
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            total = label_smoothed_loss(hidden, weight, target, 0.1, fused=fused)
        grads = torch.autograd.grad(total, (hidden, weight))
        results.append((total.detach().float(), *(g.float() for g in grads)))
    # the same bf16 logits; the gradients differ at most by bf16 roundings of p - q
    for plain, fused in zip(*results):
        torch.testing.assert_close(fused, plain, rtol=2e-2, atol=2e-2)
    assert results[1][0].item() == pytest.approx(results[0][0].item(), rel=1e-5)


def test_fused_loss_without_gradients_returns_the_loss_alone():
    torch.manual_seed(3)
    hidden, weight = torch.randn(9, 8, device=DEVICE), torch.randn(20, 8, device=DEVICE)
    target = torch.randint(0, 20, (9,), device=DEVICE)
    with torch.no_grad():
        fused = label_smoothed_loss(hidden, weight, target, 0.1, fused=True)
        plain = label_smoothed_loss(hidden, weight, target, 0.1, fused=False)
    assert fused.item() == pytest.approx(plain.item(), rel=1e-5)


def test_the_benchmarks_kernel_alone_runs_through(monkeypatch):
    """benchmarks/fused_loss.py's kernel-alone reading, its CUDA events stood in for by the host's clock:
    the glue a GPU visit would otherwise be the first to run."""
    import sys
    import time
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import fused_loss as bench

    class Event:
        def __init__(self, enable_timing: bool):
            self.t = 0.0

        def record(self) -> None:
            self.t = time.perf_counter()

        def elapsed_time(self, end: "Event") -> float:
            return 1000 * (end.t - self.t)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    alone = bench.kernel_alone(8, 2, vocab=300, device=DEVICE)
    assert alone["logits_gib"] == round(8 * 300 * 2 / 2**30, 2) and alone["kernel_ms"] > 0 < alone["copy_ms"]
    assert set(alone) == {"logits_gib", "kernel_ms", "kernel_gb_s", "copy_ms", "copy_gb_s", "share_of_copy"}
    assert alone["share_of_copy"] >= 0  # the interpreter's kernel is far slower than a copy: no ratio to check
