"""benchmarks/postnorm_kernel.py, the candidate Triton post-norm junction, held to model.residual's
LayerNorm(x + Dropout(s)), without a GPU under Triton's interpreter (tests/conftest.py chooses it)."""

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="Triton has no wheel here (the [dev] extra installs it on Linux x86-64)")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import postnorm_kernel  # noqa: E402
from tests.conftest import compile_for_sm90  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def layer(d: int) -> torch.nn.LayerNorm:
    """A LayerNorm whose gain and bias are not 1 and 0, so that their use and gradients show."""
    norm = torch.nn.LayerNorm(d, eps=1e-6, device=DEVICE)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    return norm


def leaves(*shape: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=DEVICE).manual_seed(1)
    x, s, dy = (torch.randn(*shape, device=DEVICE, generator=g).to(dtype) for _ in range(3))
    return x.requires_grad_(), s.requires_grad_(), dy


def grads(y: torch.Tensor, x, s, norm, dy) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(y, (x, s, norm.weight, norm.bias), dy)


@pytest.mark.parametrize("shape", [(37, 48), (3, 5, 64), (8, 512)])  # D no power of two; rows no multiple of 8
def test_without_dropout_it_is_layer_norm_of_the_sum(shape):
    norm = layer(shape[-1])
    x, s, dy = leaves(*shape)
    y = postnorm_kernel.post_norm(x, s, norm, 0.1, training=False)  # out of training: no dropout
    ref = F.layer_norm(x + s, shape[-1:], norm.weight, norm.bias, 1e-6)
    assert y.shape == x.shape
    torch.testing.assert_close(y, ref, atol=2e-6, rtol=1e-5)
    for got, want in zip(grads(y, x, s, norm, dy), grads(ref, x, s, norm, dy)):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_bf16_is_within_bf16s_rounding():
    norm = layer(128)
    x, s, dy = leaves(64, 128, dtype=torch.bfloat16)
    y = postnorm_kernel.post_norm(x, s, norm, 0.0, training=True)
    assert y.dtype == torch.bfloat16
    ref = F.layer_norm((x + s).float(), (128,), norm.weight, norm.bias, 1e-6)
    torch.testing.assert_close(y.float(), ref, atol=3e-2, rtol=1e-2)
    got = grads(y, x, s, norm, dy)
    want = grads(ref, x, s, norm, dy.float())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), atol=5e-2, rtol=3e-2)


def kept(seed: torch.Tensor, rows: int, d: int, p: float) -> torch.Tensor:
    """The kernel's dropout mask for ``seed``, read from its output: with x = 0, s = 1 and a unit gain,
    an element is kept exactly where the output is above the row's mean (rows neither all kept nor all
    dropped)."""
    norm = torch.nn.LayerNorm(d, device=DEVICE)
    ones = torch.ones(rows, d, device=DEVICE)
    y = postnorm_kernel.forward(torch.zeros_like(ones), ones, norm.weight, norm.bias, p, 1e-6, seed)[0]
    return y > 0


@pytest.mark.parametrize("d", [96, 100])  # 100: the last quarter of the 128-wide block partly outside the row
def test_dropout_draws_one_mask_for_forward_and_backward(d):
    rows, p = 64, 0.3
    norm = layer(d)
    x, s, dy = leaves(rows, d)
    seed = torch.tensor([1234], dtype=torch.int32, device=DEVICE)
    keep = kept(seed, rows, d, p)
    assert 0.6 < keep.float().mean() < 0.8  # P(keep) = 1 - p over 6,144 draws
    y = postnorm_kernel.forward(x, s, norm.weight, norm.bias, p, 1e-6, seed)[0]
    ref = F.layer_norm(x + s * keep / (1 - p), (d,), norm.weight, norm.bias, 1e-6)  # §5.4: inverted dropout
    torch.testing.assert_close(y, ref, atol=2e-6, rtol=1e-5)
    for got, want in zip(grads(y, x, s, norm, dy), grads(ref, x, s, norm, dy)):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    other = kept(torch.tensor([1235], dtype=torch.int32, device=DEVICE), rows, d, p)
    assert (other != keep).any()  # another seed, another mask


def test_the_mask_keeps_a_bit_an_element_and_each_of_philoxs_four_draws_is_used():
    """The forward's mask, which the backward reads: byte [r, j] holds bit k for element [r, k·Q + j] (Q a
    quarter of the row's block), and each quarter's draws keep 1 - p of its elements, whichever of Philox's
    four outputs it takes."""
    rows, d, p = 256, 128, 0.25
    norm = torch.nn.LayerNorm(d, device=DEVICE)
    seed = torch.tensor([77], dtype=torch.int32, device=DEVICE)
    ones = torch.ones(rows, d, device=DEVICE)
    mask = postnorm_kernel.forward(torch.zeros_like(ones), ones, norm.weight, norm.bias, p, 1e-6, seed)[3]
    assert mask.shape == (rows, d // 4) and mask.dtype == torch.uint8
    bits = torch.cat([(mask.int() >> k) & 1 for k in range(4)], dim=1).bool()  # [rows, d]: quarter k's columns
    assert torch.equal(bits, kept(seed, rows, d, p))
    for quarter in bits.view(rows, 4, d // 4).unbind(1):  # 8,192 draws a quarter: 1 - p ± 0.015 (3 sigma)
        assert abs(quarter.float().mean().item() - (1 - p)) < 0.015
    without = postnorm_kernel.forward(torch.zeros_like(ones), ones, norm.weight, norm.bias, 0.0, 1e-6, seed)
    assert without[3].numel() == 0  # no dropout, no mask


def test_each_call_draws_its_seed_from_torchs_generator():
    """The masks follow torch's random state: a run restored with it (a checkpoint's) draws the same ones."""
    norm = layer(32)
    x, s, _ = leaves(16, 32)
    torch.manual_seed(5)
    first, second = (postnorm_kernel.post_norm(x, s, norm, 0.5, training=True) for _ in range(2))
    torch.manual_seed(5)
    again = postnorm_kernel.post_norm(x, s, norm, 0.5, training=True)
    assert torch.equal(first, again) and not torch.equal(first, second)


def test_the_junction_bench_times_the_kernels(tmp_path):
    """gpu_layernorm.py's "kernel" way runs these kernels (the other ways: tests/test_gpu_bench.py)."""
    import gpu_layernorm

    f, params = gpu_layernorm.junction(32, 1e-6, 0.0, DEVICE, kernel=True)
    x, s, _ = leaves(8, 32)
    torch.testing.assert_close(f(x, s), F.layer_norm(x + s, (32,), *params, 1e-6), atol=2e-6, rtol=1e-5)
    row = gpu_layernorm.measure_way("kernel", 32, 1e-6, 0.1, 16, 2, DEVICE)
    assert row["ms"] > 0 and row["effective_gb_s"] == round(16 * 16 * 32 / row["ms"] / 1e6, 1)
    agreement = row["agreement"]  # the kernels against the operators in bf16, on the card that timed them
    assert set(agreement) == {"y", "dx", "ds", "dw", "db"} and max(agreement.values()) < 2e-2, agreement
    assert 0 < max(agreement.values())  # bf16 outputs of two computations: some rounding apart
    path = tmp_path / "gpu_layernorm.md"
    gpu_layernorm.report({"device_name": "cpu", "command": "c", "date": "d", "commit": "abc", "uncommitted": [],
                          "torch": "t", "rows": 16, "copy_gb_s": 1.0, "models": {"tiny": {"kernel": row}}}, path)
    assert "tiny, kernel: the kernels against the operators without dropout" in path.read_text()


COMPILE_FOR_SM90 = """
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import postnorm_kernel as pk
found = {}
BF16 = ("x_ptr", "s_ptr", "y_ptr", "dy_ptr", "dx_ptr", "ds_ptr")
# the float arguments as Triton's launcher passes Python floats (fp32) and as Inductor does (fp64)
for kernel, floats in [(k, f) for k in (pk._forward.fn, pk._backward.fn) for f in ("fp32", "fp64")]:
    names = kernel.arg_names
    pointers = [n for n in names if n.endswith("_ptr")]
    signature = {n: "*bf16" if n in BF16 else "*i32" if n == "seed_ptr" else "*u8" if n == "mask_ptr" else "*fp32"
                 for n in pointers}
    signature |= {n: "constexpr" if n in ("DROP", "ROWS", "BLOCK_D") else floats if n in ("p", "scale", "eps")
                  else "i32" for n in names if n not in pointers}
    signature = {n: signature[n] for n in names}
    # what the launcher tells the compiler at d_model 512: 16-byte aligned tensors, D a multiple of 16
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in pointers + ["D"]}
    for config in pk._configs():  # every configuration the autotuner may pick must compile
        constants = {"DROP": True, "BLOCK_D": 512, **config.kwargs}
        try:
            compiled = triton.compile(ASTSource(kernel, signature, constants, attrs),
                                      target=GPUTarget("cuda", 90, 32), options={"num_warps": config.num_warps})
        except RuntimeError as e:  # a Triton without its NVIDIA backend's tools (ptxas)
            print(json.dumps({"skip": str(e).splitlines()[0][:200]}))
            sys.exit()
        if config.kwargs["ROWS"] == 8 and config.num_warps == 4 and floats == "fp64":
            found[kernel.__name__] = re.findall(r"(?:ld|st)\\.global(?:\\.\\w+)*", compiled.asm["ptx"])
print(json.dumps(found))
"""


def test_the_kernels_compile_for_a_gpu_and_move_16_bytes_per_access():
    """Both kernels as a GPU's Triton compiles them (PTX for sm_90, made here without a GPU, in a process of
    its own: this one runs the interpreter), at base's d_model with dropout: every configuration the autotuner
    may pick compiles (the interpreter runs code a compiler may refuse), with its float arguments fp32 (Triton's
    launcher) and fp64 (Inductor's: on the 2026-12-04 visit the backward's fp32 sums failed to compile there),
    and at 8 rows a program and 4 warps the bf16 rows are read and written 16 bytes per access."""
    found = compile_for_sm90(COMPILE_FOR_SM90)
    assert set(found) == {"_forward", "_backward"}
    for name, accesses in found.items():
        assert any(a.endswith("v4.b32") for a in accesses if a.startswith("ld")), (name, accesses)
        assert any(a.endswith("v4.b32") for a in accesses if a.startswith("st")), (name, accesses)
        assert not any(a.endswith(".b16") for a in accesses), (name, accesses)


TRACE_FOR_A_GPU = """
import json
import torch
import triton
from functorch.compile import aot_function
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from triton.backends.compiler import GPUTarget
import postnorm_kernel as pk


class Hopper:  # what Triton's driver tells a compiler about an H100 or H200, where there is none
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0


triton.runtime.driver.set_active(Hopper())  # Inductor reads what each kernel writes from its Triton IR
pk._processors = lambda device: 132  # an H200's multiprocessors: no GPU here to ask
graphs = []


def junction(x, s, w, b, dy):
    seed = torch.randint(0, 2**31 - 1, (1,), device=x.device, dtype=torch.int32)
    y, mean, rstd, mask = pk.forward(x, s, w, b, 0.1, 1e-6, seed)
    return (y, *pk.backward(dy, x, s, w, mean, rstd, mask, 0.1))


def keep(gm, _):
    graphs.append(gm)
    raise SystemExit  # traced: nothing to run on a CPU-only torch


env = ShapeEnv()  # shape-generic, as the trainer and gpu_layernorm.py compile: the rows and d_model symbols
rows, d = (env.create_symintnode(env.create_symbol(n, ConstantSource(name)), hint=n) for name, n in
           (("rows", 4096), ("d", 512)))
with FakeTensorMode(allow_non_fake_inputs=True, shape_env=env):
    x, s, dy = (torch.empty(rows, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    w, b = torch.empty(512, device="cuda"), torch.empty(512, device="cuda")
    try:
        aot_function(junction, fw_compiler=keep)(x, s, w, b, dy)
    except SystemExit:
        pass
nodes = [n for n in graphs[0].graph.nodes if n.op == "call_function"]
print(json.dumps({"targets": [str(n.target) for n in nodes],
                  "kernels": [{"written": n.kwargs["tensors_to_clone"], "M": str(n.kwargs["kwargs"]["M"]),
                               "D": n.kwargs["kwargs"]["D"]}
                              for n in nodes if "triton_kernel_wrapper" in str(n.target)]}))
"""


def test_compiling_traces_into_the_kernels():
    """What torch.compile sees of the two operators, traced for a GPU without one (fake CUDA tensors and a
    Hopper target, in a process without the interpreter, whose kernels cannot be traced), rows symbolic as in
    the trainer's shape-generic graphs: not opaque calls (an opaque operator's Python dispatch and Triton's
    launcher cost more host time than the kernels), but the two Triton kernels themselves, which Inductor then
    launches from its own code; each writes only its outputs (nothing it reads is copied first), d_model
    becomes a constant of the kernels (their block) while the rows stay a symbol; the partial sums' reduction
    beside them."""
    found = compile_for_sm90(TRACE_FOR_A_GPU)
    assert not any("postnorm_kernel" in t for t in found["targets"]), found["targets"]
    forward, backward = found["kernels"]
    assert forward["written"] == ["y_ptr", "mean_ptr", "rstd_ptr", "mask_ptr"], forward
    assert backward["written"] == ["dx_ptr", "ds_ptr", "dw_ptr", "db_ptr"], backward
    for kernel in (forward, backward):
        assert kernel["D"] == 512 and not kernel["M"].isdigit(), kernel
    assert sum("aten.sum" in t for t in found["targets"]) == 2  # the gain's and the bias's gradients


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiling Triton kernels in a graph needs a CUDA GPU "
                    "(test_compiling_traces_into_the_kernels traces them without one)")
@pytest.mark.parametrize("p", [0.0, 0.1])
def test_a_compiled_model_calls_the_kernels(p):
    """torch.compile as the trainer compiles (shape-generic), in one graph: compiled and eager agree exactly
    without dropout, and with it the graph holds the seed's draw (no break) and one mask serves forward and
    backward."""
    norm = layer(32)
    x, s, dy = leaves(4, 5, 32)

    def junction(x, s):
        return postnorm_kernel.post_norm(x, s, norm, p, training=True)

    torch._dynamo.reset()
    compiled = torch.compile(junction, fullgraph=True, dynamic=True)
    y = compiled(x, s)
    got = grads(y, x, s, norm, dy)
    if p == 0.0:
        want = junction(x, s)
        assert torch.equal(y, want)
        for a, b in zip(got, grads(want, x, s, norm, dy)):
            assert torch.equal(a, b)
    else:  # the mask is one draw for forward and backward: the dropped elements get no gradient through s
        dropped = got[1] == 0
        assert 0.02 < dropped.float().mean() < 0.25 and not (got[0][dropped] == 0).all()


@pytest.mark.parametrize("p", [0.0, 0.1])
def test_a_models_training_step_through_the_kernels(monkeypatch, p):
    """gpu.py's kernel rows: a whole model's junctions through the kernels (``gpu.junctions_through_kernels``,
    here on the CPU under the interpreter) in bf16 autocast, as the trainer's post-norm stream runs in bf16.
    Without dropout the loss and every gradient agree with the operators' to bf16's rounding through the
    stack (the kernels normalise in fp32 with fp32 gains, the operators with bf16 ones); with dropout every
    junction draws its own mask, so the loss moves and the gradients stay finite."""
    import gpu

    from transformer.config import load_config
    from transformer.data import Example, collate
    from transformer.model import Transformer
    from transformer.train import batch_loss

    monkeypatch.setattr(gpu, "KERNEL_DEVICES", ("cuda", "cpu"))
    cfg = load_config("tiny")
    torch.manual_seed(0)
    model = Transformer(dataclasses.replace(cfg.model, p_drop=p), 50)
    g = torch.Generator().manual_seed(3)
    examples = [Example(torch.randint(3, 50, (n,), generator=g).tolist(), torch.randint(3, 50, (n + 2,),
                                                                                          generator=g).tolist())
                for n in (5, 9, 7)]
    batch = collate(examples, [0, 1, 2])

    def step(through_kernels: bool) -> tuple[float, dict[str, torch.Tensor]]:
        model.zero_grad()
        torch.manual_seed(1)
        with gpu.junctions_through_kernels(through_kernels), torch.autocast("cpu", torch.bfloat16):
            loss = batch_loss(model, batch, 0.1)
        loss.backward()
        return loss.item(), {name: q.grad.float().clone() for name, q in model.named_parameters()}

    want_loss, want = step(False)
    got_loss, got = step(True)
    if p == 0.0:
        assert got_loss == pytest.approx(want_loss, rel=1e-2)
        for name, a in got.items():
            if name.endswith("k_proj.bias"):  # zero in exact arithmetic (softmax ignores a score shared by all
                continue  # keys): both are rounding, and unalike
            cosine = torch.nn.functional.cosine_similarity(a.flatten(), want[name].flatten(), dim=0)
            assert cosine > 0.97, (name, cosine)
    else:
        assert got_loss != want_loss and all(torch.isfinite(a).all() for a in got.values())
