"""benchmarks/gpu.py's profile summary (issue 47): kernels sorted into kinds by name, per-step sums.
The profile itself needs a CUDA GPU; what it does with the kernels it finds is checked here, and
benchmarks/gpu_attention.py's glue on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu  # noqa: E402
import gpu_attention  # noqa: E402
import gpu_layernorm  # noqa: E402
import provenance  # noqa: E402
from transformer.config import load_config  # noqa: E402
from transformer.data import Batch  # noqa: E402

# names as torch.profiler reports them on an H100 (shortened where they run on)
KERNELS = {
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0": "attention",
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128>>": "attention",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas": "matmul",
    "nvjet_tst_192x192_64x4_2x1_v_bz_coopA_TNT": "matmul",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(Params)": "matmul",
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}> >(int, ...)": "copies",
    "void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul> >(int, ...)": "copies",
    "triton_poi_fused__to_copy_7": "copies",  # inductor: copying is all it does
    "triton_poi_fused_cat_clone_2": "copies",
    "triton_poi_fused__to_copy_add_native_dropout_3": "elementwise",  # the cast rides on an elementwise pass
    "triton_red_fused__to_copy_native_layer_norm_5": "layernorm",
    "Memcpy HtoD (Pageable -> Device)": "copies",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >(int, ...)": "elementwise",
    "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<c10::BFloat16, float, unsigned int, 1, 4, bool>(...)": "elementwise",
    "triton_poi_fused_mul_relu_4": "elementwise",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)0, false> >(...)": "optimizer",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForwardSmem<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(...)": "softmax/loss",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>(...)": "layernorm",
    "triton_red_fused_native_layer_norm_5": "layernorm",
    "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float, float, 32u, 32u, 256u, false, true>(...)": "layernorm",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(...)>, unsigned int, float, 4> >(...)": "reduction",
    "void at::native::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>(...)": "indexing",
    "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float, float, long>(...)": "indexing",
    "Memset (Device)": "other",
    "aten::_addmm_activation": "matmul",  # as a CPU trace names linear_relu.py's product
}


@pytest.mark.parametrize("name, kind", KERNELS.items())
def test_kernel_kinds(name, kind):
    assert gpu.kernel_kind(name) == kind


def test_kernel_summary_sums_per_step():
    kernels = [("sm90_xmma_gemm_bf16", 30_000.0, 40), ("nvjet_tst_192x192", 10_000.0, 20),
               ("void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda>", 20_000.0, 100),
               ("triton_poi_fused_add_0", 4_000.0, 40)]
    s = gpu.kernel_summary(kernels, steps=4, step_ms=20.0)
    assert s["kernel_ms_per_step"] == {"matmul": 10.0, "copies": 5.0, "elementwise": 1.0}
    assert list(s["kernel_ms_per_step"]) == ["matmul", "copies", "elementwise"]  # largest first
    assert s["kernel_ms_total"] == 16.0 and s["kernels_per_step"] == 50 and s["gpu_busy"] == 0.8
    assert s["top_kernels"][0] == {"name": "sm90_xmma_gemm_bf16", "kind": "matmul", "ms_per_step": 7.5,
                                   "launches_per_step": 10.0}
    assert gpu.kernel_summary(kernels, steps=4, step_ms=10.0)["gpu_busy"] == 1.0  # capped: one stream


def test_compare_curves_finds_the_largest_gap_and_its_step():
    before = [10.0, 8.0, 6.0, 5.0]
    same = gpu.compare_curves(before, list(before))
    assert same["max_rel_diff"] == 0.0 and same["within"] and same["steps"] == 4
    off = gpu.compare_curves(before, [10.0, 8.04, 6.12, 5.0])  # 0.5% at step 2, 2% at step 3
    assert off["at_step"] == 3 and off["max_rel_diff"] == pytest.approx(0.02) and not off["within"]
    assert off["first_step_rel_diff"] == 0.0 and off["mean_rel_diff"] == pytest.approx(0.025 / 4)
    assert gpu.compare_curves(before, [10.0, 8.04, 6.0, 5.0])["within"]  # 0.5% <= 1e-2
    with pytest.raises(ValueError, match="3 and 4 steps"):
        gpu.compare_curves(before[:3], before)


def test_loss_curve_is_one_fixed_run_that_learns_the_copy_batches():
    batches = gpu.synthetic_batches(256, 200, copy=True)[0]
    assert all(b.src.tolist() == b.tgt_out.tolist() for b in batches[:2])  # each target is its source
    first = gpu.loss_curve("tiny", "fp32", batches, 40, device="cpu")
    assert first == gpu.loss_curve("tiny", "fp32", batches, 40, device="cpu")  # seeded: the same run twice
    assert first[-1] < first[0] - 1.0  # it learns: a curve that can drift, not ln V throughout


def test_report_with_before_writes_speedups_memory_and_the_curve(tmp_path, monkeypatch):
    """main()'s report from measured rows, on the CPU: the measurements replaced by fixed rows, so a GPU
    visit's minutes are not spent finding a formatting fault."""
    def row(mode, ms, gib):
        return {"model": "base", "mode": mode, "parameters": 1, "step_ms": ms, "tgt_tokens_per_step": 25_000,
                "tgt_tokens_per_s": 1, "model_tflops": 1.0, "mfu": 0.2, "peak_memory_gib": gib, "skipped_steps": 0,
                **({"host_overlap": {"steps": 10, "rounds": 3, "sync_ms": ms, "late_ms": ms - 1.5,
                                     "late_pinned_ms": ms - 2.25}} if "×" not in mode else {})}
    profiled = {"model": "base", "mode": "bf16", "step_ms": 50.0, "kernel_ms_per_step": {"matmul": 10.0},
               "kernel_ms_total": 10.0, "kernels_per_step": 100, "gpu_busy": 0.2, "top_kernels": [],
               "sources": {"copies": [{"source": "model.py:98 apply ← model.py:273 forward · aten::linear",
                                       "ms_per_step": 1.25, "launches_per_step": 24.0, "shape": [400, 64, 512]}],
                           "elementwise": [],
                           "matmul": [{"source": "(no package frame) · aten::mm [[24992, 512], [512, 1536]]",
                                       "ms_per_step": 0.5, "launches_per_step": 6.0, "shape": [24992, 512],
                                       "tflop_s": 472.0}]},
               "idle": {"steps": 3, "span_ms_per_step": 60.0, "idle_ms_per_step": 12.5, "gaps_per_step": 900.0,
                        "long_gaps_per_step": 40.0, "idle_ms_per_step_in_long_gaps": 6.0, "queue_ms_median": 0.02,
                        "by_launch": [{"launched_by": "aten::copy_", "ms_per_step": 2.5, "gaps_per_step": 1.0,
                                       "longest_us": 2500.0}],
                        "host_in_long_gaps": [{"host": "aten::item › cudaStreamSynchronize", "ms_per_step": 2.25}]}}
    before = {"package": "before47", "rows": [row("bf16", 60.0, 10.0)],
              "curve": [10.0, 9.0, 8.0], "curve_nudged": [10.0, 9.0, 8.2], "curve_redrawn": [10.5, 9.0, 8.0]}
    micro_shapes = []
    monkeypatch.setattr(gpu.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu.torch.cuda, "get_device_name", lambda: "Test GPU")
    earlier = []
    monkeypatch.setattr(gpu, "measure_before", lambda args: earlier.append(args.earlier_modes) or before)
    def measure(name, mode, batches, steps, warmup, src_len, tgt_len, micro=1, profile=0):
        if micro > 1:
            micro_shapes.extend(gpu.shape(b) for b in batches)
        return (row(mode if micro == 1 else f"{mode} ×{micro}", 50.0 if micro == 1 else 80.0, 10.5),
                profiled if profile else None)
    monkeypatch.setattr(gpu, "measure", measure)
    def curve(name, mode, batches, steps, device="cuda", nudge=0.0, dropout_seed=None):
        return [10.5, 9.0, 8.0] if dropout_seed else [10.0, 9.0, 8.1] if mode == "bf16+compile" else [10.0, 9.05, 8.0]
    monkeypatch.setattr(gpu, "loss_curve", curve)
    monkeypatch.setattr(gpu, "attention_kernels", lambda batch: ["flash_fwd"])
    fresh_shapes = []
    first = {"cudnn_attention": {"batches": 8, "first_ms": 500.0, "again_ms": 50.0, "per_new_shape_ms": 450.0},
             "efficient_attention": {"error": "No available kernel."}}
    monkeypatch.setattr(gpu, "first_shape_cost",
                        lambda batches, n: fresh_shapes.extend(map(gpu.shape, batches)) or first)
    monkeypatch.setattr(gpu, "fp16_overflow_is_skipped", lambda batch: {"first_step_applied": False})
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--models", "base", "--modes", "bf16,bf16+cudagraphs", "--tokens",
                                      "2000", "--before", "before47", "--results", str(tmp_path), "--accumulate", "4",
                                      "--curve-modes", "bf16+compile"])
    gpu.main()
    assert earlier == [["bf16"]]  # the earlier package has no CUDA-graph row to measure
    result = json.loads((tmp_path / "gpu_train.json").read_text())
    assert result["before"]["speedup"] == {"base bf16": 1.2}
    assert result["curve"]["at_step"] == 2 and result["curve"]["within"]  # 9.05 against 9.0: 0.56% <= 1%
    assert result["curve"]["after"] == [10.0, 9.05, 8.0] and result["first_shape"] == first
    (candidate,) = result["curve_candidates"]  # against this run's bf16 curve, beside its redrawn masks' floor
    assert candidate["mode"] == "bf16+compile" and candidate["at_step"] == 3 and not candidate["within"]
    assert candidate["max_rel_diff"] == pytest.approx(0.0125)
    assert candidate["floor_dropout"] == {"max_rel_diff": pytest.approx(0.05), "at_step": 1,
                                          "mean_rel_diff": pytest.approx((0.05 + 0.05 / 9.05) / 3)}
    assert result["curve"]["floor"] == {"nudge": 2.0**-20, "max_rel_diff": pytest.approx(0.025), "at_step": 3,
                                        "mean_rel_diff": pytest.approx(0.025 / 3)}
    assert result["curve"]["floor_dropout"] == {"max_rel_diff": pytest.approx(0.05), "at_step": 1,
                                                "mean_rel_diff": pytest.approx(0.05 / 3)}
    # the micro-batch rows cycle through the shapes their warm-up meets (5 steps × 4); the first-shape
    # cost is read on shapes no row met
    assert len(micro_shapes) == 20 and fresh_shapes and not set(fresh_shapes) & set(micro_shapes)
    md = (tmp_path / "gpu_train.md").read_text()
    assert result["commit"] == provenance.git("rev-parse", "--short", "HEAD") != ""
    assert f"commit {result['commit']}" in md
    assert "| base | bf16 | 60.0 | 50.0 | 1.2× | 20.0% | 20.0% | 10.0 | 10.5 |" in md
    assert [r["mode"] for r in result["rows"]] == ["bf16", "bf16+cudagraphs", "bf16 ×4"]
    assert "| base | bf16 ×4 | 80.0 |" in md and "| base | bf16+cudagraphs | 50.0 |" in md
    assert "3 rounds of blocks of 10 steps" in md and "| base | bf16 | 50.0 | 48.5 | 47.75 | 2.25 ms |" in md
    assert "base bf16: the GPU idle 12.5 ms per step (900.0 gaps, 40.0 of them over 20 µs holding 6.0 ms)" in md
    assert "| aten::copy_ | 2.5 | 1.0 | 2500.0 |" in md
    assert "| aten::item › cudaStreamSynchronize | 2.25 |" in md  # what the host did inside the long gaps
    assert "4 micro-batches of ~500 (the WMT recipes' layout on one device: update_freq 4)" in md
    assert "largest gap 5.56e-03 relative (step 2)" in md
    assert "moves its curve by up to 2.50e-02 (step 3), mean 8.33e-03." in md
    assert "| bf16+compile | 3 | 1.25e-02 (3) | 0.00e+00 | 6.01e-03 | no | 5.00e-02 (1), 1.85e-02 |" in md
    assert "| cudnn_attention | 8 | 500.0 | 50.0 | 450.0 |" in md
    assert "| efficient_attention | refused: No available kernel. | | | |" in md
    assert "base bf16: the copies kernels' sources" in md and "elementwise kernels' sources" not in md  # none found
    assert "| model.py:98 apply ← model.py:273 forward · aten::linear | 1.25 | 24.0 | [400, 64, 512] |" in md
    assert "| (no package frame) · aten::mm [[24992, 512], [512, 1536]] | 0.5 | 6.0 | 472.0 |" in md  # the rate
    assert "| source | ms per step | launches per step | TFLOP/s |" in md


@pytest.mark.parametrize("modes, profiled", [("fp32", []), ("fp32,bf16+compile", ["bf16+compile"])])
def test_the_default_profile_takes_the_measured_precisions_among_its_own(modes, profiled, tmp_path, monkeypatch):
    """Left alone, --profile profiles bf16 and bf16+compile where --modes measures them, and refuses nothing."""
    seen = []

    class Stop(BaseException):  # not a failed row (those are caught): the end of what the test needs
        pass

    def measure(name, mode, *args, micro=1, profile=0):
        seen.append((mode, profile))
        if len(seen) == len(modes.split(",")):
            raise Stop

    monkeypatch.setattr(gpu.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu, "measure", measure)
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--models", "base", "--modes", modes, "--tokens", "2000",
                                      "--results", str(tmp_path)])
    with pytest.raises(Stop):
        gpu.main()
    assert [mode for mode, profile in seen if profile] == profiled


def traced_tiny_steps(monkeypatch, amp_dtype):
    """A tiny model's two training steps (after one untraced) traced on the CPU with shapes and stacks, as
    profile_steps traces a GPU's: the model and the profiler's events."""
    from torch.profiler import ProfilerActivity, profile

    from transformer.train import train_step

    monkeypatch.setattr(gpu, "VOCAB", 2000)  # the tracing, not the paper's vocabulary: bf16 is slow on CPUs without it
    batches = gpu.synthetic_batches(400, 240)[0]
    _, model, optimizer, dist = gpu.on_gpu("tiny", device="cpu")
    step = lambda b: train_step(model, optimizer, [b], 0.1, 1e-4, 0.0, dist, None, amp_dtype)  # noqa: E731
    step(batches[0])
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True) as prof:
        step(batches[1])
        step(batches[2])
    return model, prof.events()


def test_kernel_sources_names_the_lines_that_launch_copies(monkeypatch):
    """On the CPU each aten operator is its own kernel: a tiny model's bf16 autocast steps, traced, must charge
    every copy to a line of the package, autocast's casts of a projection's input to the projection's line in
    the forward pass and, through the autograd node's sequence number, in the backward pass too."""
    _, events = traced_tiny_steps(monkeypatch, gpu.torch.bfloat16)
    found = gpu.kernel_sources(events, steps=2, kinds=("copies",), top=1000, device="cpu")["copies"]
    copies = [e for e in events if e.name.startswith("aten::") and not e.cpu_children
              and gpu.kernel_kind(e.name) == "copies"]
    assert sum(r["ms_per_step"] for r in found) == pytest.approx(sum(e.self_cpu_time_total for e in copies) / 2000,
                                                                   abs=1e-3 * len(found))  # every copy charged once
    assert [r["ms_per_step"] for r in found] == sorted((r["ms_per_step"] for r in found), reverse=True)
    assert not [r for r in found if r["source"].startswith("(no package frame)")]
    assert all(gpu.kernel_kind(r["kernel"]) == "copies" for r in found)  # each source's costliest kernel, named
    sources = {r["source"] for r in found}
    qkv = [s for s in sources if s.startswith("model.py:") and "_project" in s]
    assert any(s.endswith("· aten::linear") for s in qkv), sources  # the input's cast to bf16, forward
    assert any(s.endswith("· ToCopyBackward0") for s in qkv), sources  # its gradient's cast back, backward


def test_kernel_sources_tells_the_products_apart_by_shape_with_their_rates(monkeypatch):
    """Matrix products by their operands' shapes, each with its multiply-adds' rate: every product of a tiny
    model's traced fp32 steps charged once, the loss's logits product [rows, d] × [d, V] among them under the
    loss's line, and each row's rate its products' 2·M·N·K over their time."""
    model, events = traced_tiny_steps(monkeypatch, None)
    found = gpu.kernel_sources(events, steps=2, kinds=("matmul",), top=1000, device="cpu")["matmul"]
    products = [e for e in events if e.name in ("aten::mm", "aten::addmm", "aten::bmm")]
    assert sum(r["launches_per_step"] for r in found) == len(products) / 2  # every product charged once
    flops = sum(gpu.product_flops(e.name, [list(x) for x in e.input_shapes if x]) for e in products)
    # each row's rate times its time gives back its multiply-adds: all rows, all the products'
    assert sum(r["tflop_s"] * r["ms_per_step"] for r in found) == pytest.approx(flops / 2e9, rel=0.02)
    d = model.cfg.d_model
    logits = [r for r in found if r["source"].startswith("loss.py:") and f", [{d}, 2000]]" in r["source"]]
    assert logits and all("aten::mm [[" in r["source"] for r in logits), [r["source"] for r in found]
    assert {r["kernel"] for r in found} <= {"aten::mm", "aten::addmm", "aten::bmm"}


def test_a_product_that_launches_two_kernels_counts_its_multiply_adds_once():
    """On a GPU an operator's kernels are its launches: a split-K product launches the product and a reduction,
    both matmul kernels by name. The row counts both launches and their time, and the product's multiply-adds
    once (twice would double its rate)."""
    class Kernel:
        def __init__(self, name, duration):
            self.name, self.duration = name, duration

    class Event:  # what kernel_sources reads of a torch.profiler FunctionEvent
        def __init__(self, name, kernels, shapes):
            self.name, self.kernels, self.input_shapes = name, kernels, shapes
            self.device_type, self.cpu_parent, self.sequence_nr, self.cpu_children = "DeviceType.CPU", None, -1, []

    mm = Event("aten::mm", [Kernel("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_splitK_NTT", 30.0),
                            Kernel("cublasLt::splitKreduce_kernel", 10.0)], [[4096, 512], [512, 37000]])
    (row,) = gpu.kernel_sources([mm], steps=1, kinds=("matmul",))["matmul"]
    assert row["launches_per_step"] == 2.0 and row["ms_per_step"] == 0.04
    assert row["tflop_s"] == float(f"{2 * 4096 * 512 * 37000 / 40 / 1e6:.3g}")  # 3880: this test's made-up times


def test_product_flops_reads_each_products_operands():
    f = gpu.product_flops
    assert f("aten::mm", [[3, 4], [4, 5]]) == 2 * 3 * 4 * 5
    assert f("aten::addmm", [[5], [3, 4], [4, 5]]) == 2 * 3 * 4 * 5
    assert f("aten::_addmm_activation", [[5], [3, 4], [4, 5]]) == 2 * 3 * 4 * 5  # linear_relu.py's
    assert f("aten::bmm", [[2, 3, 4], [2, 4, 5]]) == 2 * 2 * 3 * 4 * 5
    assert f("aten::baddbmm", [[2, 3, 5], [2, 3, 4], [2, 4, 5]]) == 2 * 2 * 3 * 4 * 5
    assert f("aten::mm", [[3, 4], [5, 6]]) is None  # inner dimensions differ
    assert f("aten::bmm", [[2, 3, 4], [3, 4, 5]]) is None  # batches differ
    assert f("aten::mm", [[2, 3, 4], [2, 4, 5]]) is None  # not mm's operands
    assert f("aten::add", [[3, 4], [3, 4]]) is None and f("aten::mm", [[3, 4]]) is None


def test_a_row_and_its_profile_run_through_on_the_cpu(monkeypatch):
    """measure() and profile_steps() end to end on the CPU, their CUDA calls stood in for: the glue a GPU
    visit would otherwise be the first to run (micro-batches, the profile of the row's own model)."""
    import torch.profiler

    for name in ("synchronize", "reset_peak_memory_stats", "empty_cache"):
        monkeypatch.setattr(gpu.torch.cuda, name, lambda *a, **k: None)
    monkeypatch.setattr(gpu.torch.cuda, "max_memory_allocated", lambda *a, **k: 0)
    reads = []  # the allocator's counters: 4 cudaMalloc and 2 cudaFree more at each read, never a retry
    monkeypatch.setattr(gpu.torch.cuda, "memory_stats", lambda *a, **k: reads.append(1) or {
        "num_device_alloc": 4 * len(reads), "num_device_free": 2 * len(reads), "num_alloc_retries": 0})
    real = torch.profiler.profile
    monkeypatch.setattr(torch.profiler, "profile",
                        lambda activities, **kw: real(activities=[torch.profiler.ProfilerActivity.CPU], **kw))
    on_gpu = gpu.on_gpu
    monkeypatch.setattr(gpu, "on_gpu", lambda name, device="cuda": on_gpu(name, "cpu"))
    monkeypatch.setattr(gpu, "VOCAB", 2000)  # the glue, not the paper's vocabulary: bf16 is slow on CPUs without it
    batches, src_len, tgt_len = gpu.synthetic_batches(160, 96)
    row, profiled = gpu.measure("tiny", "bf16", batches, 2, 1, src_len, tgt_len, micro=2, profile=1)
    assert row["mode"] == "bf16 ×2" and row["micro_batches"] == 2 and row["skipped_steps"] == 0
    # read before and after the 2 timed steps: the counts' growth a step
    assert row["allocator_per_step"] == {"num_device_alloc": 2.0, "num_device_free": 1.0, "num_alloc_retries": 0.0}
    assert gpu.allocator_text(row) == "2 / 1 / 0" and gpu.allocator_text({}) == "–"
    assert row["tgt_tokens_per_step"] > max(b.n_tgt_tokens for b in batches)  # two batches a step
    assert profiled["mode"] == "bf16 ×2" and profiled["step_ms"] == row["step_ms"]
    assert set(profiled["sources"]) == {"copies", "elementwise", "matmul"}
    assert profiled["idle"]["gaps_per_step"] == 0 and profiled["idle"]["steps"] == gpu.IDLE_STEPS  # no GPU work
    assert "host_overlap" not in row  # micro-batch rows: the outcome is read once per step either way
    monkeypatch.setattr(gpu.torch, "compile", lambda model, **kw: model)
    monkeypatch.setattr(Batch, "pin_memory", lambda batch: batch)  # page-locked memory needs CUDA
    marks = []
    monkeypatch.setattr(gpu.torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    row, profiled = gpu.measure("tiny", "bf16+cudagraphs", batches, 2, 1, src_len, tgt_len)
    assert profiled is None  # not profiled unless asked
    overlap = row["host_overlap"]
    assert overlap["steps"] == 2 and overlap["rounds"] == 3 and overlap["sync_ms"] > 0 and overlap["late_pinned_ms"] > 0
    assert len(marks) == 3 + 3 * 3 * 2  # every step of the CUDA-graph row starts a new step of the graphs
    assert row["cudagraph_skips"] == 0  # nothing compiled here (torch.compile stood in for)
    import torch._inductor.config as inductor

    tuning, real_step = [], gpu.train_step
    monkeypatch.setattr(gpu, "train_step",
                        lambda *a: tuning.append(inductor.coordinate_descent_tuning) or real_step(*a))
    gpu.measure("tiny", "bf16", batches, 2, 1, src_len, tgt_len, micro=2)
    gpu.measure("tiny", "bf16+tuned", batches, 2, 1, src_len, tgt_len, micro=2)
    # Inductor compiles at a row's first steps: the tuned row's steps all run with its options, no other's
    assert tuning == [False] * 3 + [True] * 3 and not inductor.coordinate_descent_tuning
    import transformer.model

    operators, junctions = transformer.model.residual, []
    monkeypatch.setattr(gpu, "train_step", lambda *a: junctions.append(transformer.model.residual) or real_step(*a))
    for mode in gpu.KERNEL_MODES:  # eager and compiled (torch.compile stood in for above)
        junctions.clear()
        row, _ = gpu.measure("tiny", mode, batches, 2, 1, src_len, tgt_len, micro=2)
        # the kernel row's steps run the replaced junction (here on the CPU it hands back to the operators)
        assert len(junctions) == 3 and operators not in junctions and transformer.model.residual is operators
        assert row["mode"] == f"{mode} ×2" and row["skipped_steps"] == 0
    appliers = []
    monkeypatch.setattr(gpu, "train_step", lambda *a: appliers.append(transformer.model.apply) or real_step(*a))
    applier = transformer.model.apply
    for mode in gpu.EPILOGUE_MODES:  # the feed-forward layers' first product through linear_relu.py
        appliers.clear()
        row, _ = gpu.measure("tiny", mode, batches, 2, 1, src_len, tgt_len, micro=2)
        assert len(appliers) == 3 and applier not in appliers and transformer.model.apply is applier
        assert row["skipped_steps"] == 0
    orders = []  # SDPA's backends in the order it tries them, as each step begins
    monkeypatch.setattr(gpu, "train_step",
                        lambda *a: orders.append(torch._C._get_sdp_priority_order()) or real_step(*a))
    before = torch._C._get_sdp_priority_order()
    gpu.measure("tiny", "bf16+compile", batches, 2, 1, src_len, tgt_len, micro=2)
    gpu.measure("tiny", "bf16+compile+efficient", batches, 2, 1, src_len, tgt_len, micro=2)
    efficient = int(torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION)
    assert [o[0] == efficient for o in orders] == [before[0] == efficient] * 3 + [True] * 3
    assert torch._C._get_sdp_priority_order() == before  # restored after the row


def test_compiled_rows_compile_as_the_trainer_does(monkeypatch):
    """The bf16+compile rows measure what train.compile runs (train.compiled: the sinusoid table made
    before tracing, a shape-generic graph), not a plain torch.compile of their own."""
    calls = []
    monkeypatch.setattr(gpu.torch, "compile", lambda model, **kw: calls.append(kw) or model)
    _, raw, _, dist = gpu.on_gpu("tiny", device="cpu")
    assert raw._sinusoids is None
    assert gpu.compile_like_the_trainer(raw, dist.device) is raw
    assert calls == [{"dynamic": True, "mode": None}] and raw._sinusoids is not None
    assert gpu.compile_like_the_trainer(raw, dist.device, gpu.MODES["bf16+cudagraphs"][1]) is raw
    assert calls[1] == {"dynamic": True, "mode": "reduce-overhead"}  # the same graphs, replayed as CUDA graphs
    assert gpu.compile_like_the_trainer(raw, dist.device, gpu.MODES["bf16+tuned"][1]) is raw
    assert calls[2] == calls[0]  # the trainer's own compile; measure() sets Inductor's options around it


@pytest.mark.parametrize("args, message", [
    (["--accumulate", "0"], "--accumulate 0: must be at least 1"),
    (["--modes", "bf16,bf17"], "--modes: unknown precision bf17"),
    (["--profile", "fp8"], "--profile: unknown precision fp8"),
    (["--modes", "fp32", "--profile", "bf16"], "--profile bf16: bf16 not among --modes fp32"),
    (["--results", "FILE/sub"], "--results FILE/sub: Not a directory"),
    (["--first-shape", "100"], "--first-shape 100: "),
    (["--first-shape", "-1"], "--first-shape -1: "),
    (["--curve-modes", "bf16+fast"], "--curve-modes: unknown precision bf16+fast"),
    (["--curve", "0", "--curve-modes", "bf16+compile"], "--curve-modes bf16+compile: needs --curve STEPS"),
])
def test_bad_arguments_are_refused_in_one_line_before_any_measuring(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("")
    measured = []
    monkeypatch.setattr(gpu, "measure", lambda *a, **k: measured.append(a))
    monkeypatch.setattr(sys, "argv", ["gpu.py", *args])
    with pytest.raises(SystemExit) as stop:
        gpu.main()
    assert stop.value.code == 2 and not measured
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"gpu.py: error: {message}")


def test_the_earlier_package_is_measured_unprofiled_with_its_nudged_curve(tmp_path, monkeypatch):
    """--before's process gets the same arguments but --before, profiles nothing (the visit's minutes) and
    brings back its curve and its nudged curve (the floor)."""
    seen = {}

    def run(argv, env, check):
        seen["argv"], seen["path"] = argv, env["PYTHONPATH"]
        out = Path(argv[argv.index("--results") + 1])
        (out / "gpu_train.json").write_text(json.dumps({"rows": [], "curve": [1.0],
                                                        "curve_nudged": [1.1]}))
    monkeypatch.setattr(gpu.subprocess, "run", run)
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--models", "base", "--before", str(tmp_path), "--steps", "3"])
    args = gpu.argparse.Namespace(before=tmp_path, name="gpu_train", earlier_modes=["bf16", "bf16+compile"])
    measured = gpu.measure_before(args)
    argv = seen["argv"][2:]
    assert "--before" not in argv and argv[:4] == ["--models", "base", "--steps", "3"]
    assert argv[len(argv) - 1 - argv[::-1].index("--modes") + 1] == "bf16,bf16+compile"  # the last --modes wins
    assert argv[argv.index("--profile") + 1] == "" and "--rows-only" in argv
    assert argv[argv.index("--first-shape") + 1] == "0"  # the first-shape cost is the torch's, read once
    assert seen["path"].split(gpu.os.pathsep)[0] == str(tmp_path.resolve())
    assert measured["curve_nudged"] == [1.1] and measured["package"] == str(tmp_path)


def test_a_nudged_curve_starts_a_rounding_away_from_the_plain_one():
    batches = gpu.synthetic_batches(256, 200, copy=True)[0]
    plain = gpu.loss_curve("tiny", "fp32", batches, 3, device="cpu")
    nudged = gpu.loss_curve("tiny", "fp32", batches, 3, device="cpu", nudge=gpu.NUDGE)
    assert nudged != plain and nudged[0] == pytest.approx(plain[0], rel=1e-4)
    # other dropout masks over the same weights: the first loss already differs (its forward drops others),
    # and the same reseeding draws the same masks again
    redrawn = gpu.loss_curve("tiny", "fp32", batches, 3, device="cpu", dropout_seed=1)
    assert redrawn[0] != plain[0] and redrawn == gpu.loss_curve("tiny", "fp32", batches, 3, device="cpu",
                                                                 dropout_seed=1)


def test_first_shape_cost_runs_each_backend_on_batches_of_its_own(monkeypatch):
    """The glue of the first-shape measurement on the CPU (its CUDA calls stood in for): each backend steps
    through its own batches twice, and the cost per new shape is the first pass less the second."""
    for name in ("synchronize", "empty_cache"):
        monkeypatch.setattr(gpu.torch.cuda, name, lambda *a, **k: None)
    on_gpu = gpu.on_gpu
    monkeypatch.setattr(gpu, "on_gpu", lambda name, device="cuda": on_gpu(name, "cpu"))
    stepped = []
    train_step = gpu.train_step
    monkeypatch.setattr(gpu, "train_step", lambda model, opt, batches, *a: stepped.append(gpu.shape(batches[0]))
                        or train_step(model, opt, batches, *a))
    batches = gpu.synthetic_batches(400, 240)[0]
    costs = gpu.first_shape_cost(batches, per_backend=2, name="tiny")
    assert list(costs) == [b.lower() for b in gpu.FIRST_SHAPE_BACKENDS]
    shapes = [gpu.shape(b) for b in batches]
    assert stepped == [shapes[-1]] + shapes[0:2] * 2 + shapes[2:4] * 2  # a warm step, then each backend's own
    for c in costs.values():
        assert c["batches"] == 2 and c["per_new_shape_ms"] == pytest.approx(c["first_ms"] - c["again_ms"], abs=0.11)


def test_host_overlap_reads_each_outcome_once_before_or_after_the_next_step_is_queued(monkeypatch):
    monkeypatch.setattr(gpu.torch.cuda, "synchronize", lambda: None)
    log = []

    class Queued:
        def __init__(self, i):
            self.i = i

        def result(self):
            log.append(("read", self.i))
            time.sleep(0.004)  # waiting for the GPU: not the host's own time

    def queue(i, pin):
        log.append(("queue", i, pin))
        time.sleep(0.002)  # launching
        return Queued(i)

    out = gpu.host_overlap(queue, first=7, steps=3, rounds=1)
    assert set(out) == {"steps", "rounds", "sync_ms", "late_ms", "late_pinned_ms", "host_queue_ms"}
    # the launching alone: at least its 2 ms a step, and the 4 ms a step of waiting left out
    assert out["steps"] == 3 and out["host_queue_ms"] >= 2 and out["late_pinned_ms"] - out["host_queue_ms"] >= 3.9
    assert log[:6] == [("queue", 7, False), ("read", 7), ("queue", 8, False), ("read", 8), ("queue", 9, False),
                       ("read", 9)]  # at once
    assert log[6:12] == [("queue", 10, False), ("queue", 11, False), ("read", 10), ("queue", 12, False),
                         ("read", 11), ("read", 12)]  # a step late
    assert log[12:] == [("queue", 13, True), ("queue", 14, True), ("read", 13), ("queue", 15, True),
                        ("read", 14), ("read", 15)]  # a step late, from pinned batches


def test_idle_gaps_charges_each_hole_to_the_operator_that_queued_the_work_after_it():
    """A chrome trace as torch.profiler writes it (CPU and CUDA activities), made by hand: four holes between
    the GPU's work, each charged to the ranges open on the launching thread when the work after it was queued."""
    def op(name, ts, dur, tid=1, cat="cpu_op"):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}

    def launch(corr, ts, tid=1, cat="cuda_runtime", name="cudaLaunchKernel"):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": 2.0,
                "args": {"correlation": corr}}

    def work(corr, ts, dur, cat="kernel", stream=7):
        return {"ph": "X", "cat": cat, "name": f"k{corr}", "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                "args": {"correlation": corr, "stream": stream}}

    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        op("aten::linear", 0, 100), op("aten::mm", 10, 40), launch(1, 20), work(1, 30, 100),  # busy to 130
        op("aten::copy_", 200, 30), launch(2, 210, name="cudaMemcpyAsync"), work(2, 215, 5, "gpu_memcpy"),  # 85 µs
        op("cudaStreamSynchronize", 230, 30, tid=2, cat="cuda_runtime"),  # the host waits inside the next hole
        op("autograd::engine::evaluate_function: MmBackward0", 300, 100, tid=2), op("aten::mm", 310, 80, tid=2),
        launch(3, 320, tid=2, cat="cuda_driver", name="cuLaunchKernel"), work(3, 325, 10),  # 105 µs
        work(4, 326, 4, stream=8),  # on another stream, inside the busy time: no hole
        work(99, 340, 10),  # 5 µs; its launch is not in the trace
        op("## a named range ##", 5, 600, cat="user_annotation"),  # open at the next launch, not the innermost
        launch(5, 500), work(5, 505, 1),  # 155 µs, queued by no operator but the named range
    ]
    idle = gpu.idle_gaps(events, steps=1)
    assert idle["idle_ms_per_step"] == 0.35 and idle["gaps_per_step"] == 4.0  # 85 + 105 + 5 + 155 µs
    assert idle["long_gaps_per_step"] == 3.0 and idle["idle_ms_per_step_in_long_gaps"] == 0.345  # over 20 µs
    assert idle["span_ms_per_step"] == 0.48 and idle["queue_ms_median"] == 0.005  # queued 10, 5, 5, 5 µs ahead
    assert [(r["launched_by"], r["ms_per_step"], r["gaps_per_step"], r["longest_us"]) for r in idle["by_launch"]] == [
        ("## a named range ##", 0.155, 1.0, 155.0),
        ("autograd::engine::evaluate_function: MmBackward0 › aten::mm", 0.105, 1.0, 105.0),
        ("## a named range ## › aten::copy_", 0.085, 1.0, 85.0),
        ("(launch not traced)", 0.005, 1.0, 5.0)]
    # inside the three long holes, up to each launch: what the launching thread did, then each launch's latency
    assert [(r["host"], r["ms_per_step"]) for r in idle["host_in_long_gaps"]] == [
        ("## a named range ##", 0.22),  # 130-200 and 350-500
        ("(Python, no operator open)", 0.05),  # 220-230 and 260-300 on thread 2
        ("cudaStreamSynchronize", 0.03),
        ("(launch to the work's start)", 0.015),  # 210-215, 320-325, 500-505
        ("## a named range ## › aten::copy_", 0.01),
        ("autograd::engine::evaluate_function: MmBackward0", 0.01),
        ("autograd::engine::evaluate_function: MmBackward0 › aten::mm", 0.01)]
    assert sum(r["ms_per_step"] for r in idle["host_in_long_gaps"]) == pytest.approx(
        idle["idle_ms_per_step_in_long_gaps"])  # every long hole's time, once
    assert gpu.idle_gaps(events, steps=2)["gaps_per_step"] == 2.0  # per step
    without_ranges = [e for e in events if e.get("cat") not in ("cpu_op", "user_annotation")]
    assert gpu.idle_gaps(without_ranges, steps=1)["by_launch"][0]["launched_by"] == \
        "cudaLaunchKernel (outside any operator)"
    assert gpu.idle_gaps([], steps=1) == {"steps": 1, "span_ms_per_step": 0.0, "idle_ms_per_step": 0.0,
                                          "gaps_per_step": 0.0, "long_gaps_per_step": 0.0,
                                          "idle_ms_per_step_in_long_gaps": 0.0, "queue_ms_median": None,
                                          "by_launch": [], "host_in_long_gaps": []}


def test_host_in_window_splits_a_hole_by_what_the_launching_thread_did():
    def r(name, ts, dur):
        return {"name": name, "ts": ts, "dur": dur}

    launch = r("cudaLaunchKernel", 90, 2)
    thread = [r("Optimizer.step", 0, 200), r("aten::_foreach_add_", 20, 30), launch]
    assert gpu.host_in_window(thread, 10, 100, launch) == {
        "(launch to the work's start)": 10, "Optimizer.step": 50, "Optimizer.step › aten::_foreach_add_": 30}
    assert gpu.host_in_window([], 10, 100, r("cudaLaunchKernel", 5, 2)) == {
        "(queued before the hole: a wait on the device)": 90}  # queued before: the device kept it waiting
    assert gpu.host_in_window(thread, 10, 100, None) == {"(launch not traced)": 90}


def test_a_row_that_fails_is_reported_and_the_rows_after_it_still_run(tmp_path, monkeypatch, capsys):
    measured = []

    def measure(name, mode, *args, micro=1, profile=0):
        measured.append(mode)
        if mode == "bf16+cudagraphs":
            raise RuntimeError("no graphs here\nsecond line")
        return {"model": name, "mode": mode, "parameters": 1, "step_ms": 50.0, "tgt_tokens_per_step": 1,
                "tgt_tokens_per_s": 1, "model_tflops": 1.0, "mfu": 0.2, "peak_memory_gib": 1.0,
                "skipped_steps": 0}, None

    monkeypatch.setattr(gpu.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(gpu.torch.cuda, "get_device_name", lambda: "Test GPU")
    monkeypatch.setattr(gpu, "measure", measure)
    monkeypatch.setattr(gpu, "attention_kernels", lambda batch: [])
    monkeypatch.setattr(gpu, "fp16_overflow_is_skipped", lambda batch: {})
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--models", "base", "--modes", "bf16+cudagraphs,bf16", "--tokens",
                                      "2000", "--results", str(tmp_path), "--accumulate", "1", "--curve", "0",
                                      "--first-shape", "0"])
    gpu.main()
    assert measured == ["bf16+cudagraphs", "bf16"]
    result = json.loads((tmp_path / "gpu_train.json").read_text())
    assert [r["mode"] for r in result["rows"]] == ["bf16"]
    assert result["failed_rows"] == [{"model": "base", "mode": "bf16+cudagraphs",
                                      "error": "RuntimeError: no graphs here"}]
    assert "| base | bf16+cudagraphs | failed: RuntimeError: no graphs here |" in (tmp_path / "gpu_train.md").read_text()
    assert "Traceback" in capsys.readouterr().err  # the cause, in the visit's log



def test_attention_ways_run_through_on_the_cpu(tmp_path, monkeypatch):
    """benchmarks/gpu_attention.py end to end on the CPU (tiny shapes): every site measured by the ways
    this device has, the others refused in the results rather than ending the run."""
    monkeypatch.setattr(sys, "argv", ["gpu_attention.py", "--device", "cpu", "--tokens", "400", "--batches", "1",
                                      "--repeat", "1", "--models", "tiny", "--results", str(tmp_path)])
    gpu_attention.main()
    result = json.loads((tmp_path / "gpu_attention.json").read_text())
    tiny = result["models"]["tiny"]
    assert tiny["calls_per_step"] == {"enc_self": 2, "dec_self": 2, "cross": 2}
    for site in gpu_attention.SITES:
        math = tiny["sites"][site]["math"]
        assert math["ms_per_call"] > 0 and math["max_abs_diff_vs_math"] == 0.0
        assert "error" in tiny["sites"][site]["varlen"]  # FlashAttention's kernels are CUDA's
    assert set(tiny["best_exact"]) == set(gpu_attention.SITES)
    assert tiny["sites"]["enc_self"]["flash"].get("exact") is False  # run without its mask: marked
    assert "| math |" in (tmp_path / "gpu_attention.md").read_text()
    assert f"commit {result['commit']}" in (tmp_path / "gpu_attention.md").read_text() and result["commit"]


@pytest.mark.parametrize("site", gpu_attention.SITES)
def test_each_way_computes_the_models_attention_at_the_real_positions(site):
    """What the ways are held to: the model's own eq. (1) (``model.attention``'s explicit path) on q, k, v
    laid out as the benchmark lays them out, compared at the real positions; on the CPU, math and (at the
    causal site, its one exact use) flash, and the packing that ``varlen`` takes."""
    import torch

    from transformer.model import attention

    batch = gpu.synthetic_batches(400, 240)[0][0]
    generator = torch.Generator().manual_seed(0)
    leaves, views, mask, causal, q_len, k_len = gpu_attention.site_inputs(site, batch, 4, 16, torch.device("cpu"),
                                                                          generator)
    q, k, v = views()
    expected = gpu_attention.packed(attention(q, k, v, mask, causal, need_weights=True)[0], q_len).float()
    ways = ("math", "flash") if causal else ("math",)
    for way in ways:
        _, call, real = gpu_attention.way_call(way, leaves, views, mask, causal, q_len, k_len)
        assert (real(call()).float() - expected).abs().max() < 3e-2, way
    assert expected.shape == (int(q_len.sum()), 4, 16)
    if site != "dec_self":  # padding: the masked sites' query and key lengths are the sentences' own
        assert int(k_len.min()) < batch.src.size(1)


def test_packed_keeps_each_rows_real_positions_in_order():
    import torch

    t = torch.arange(2 * 1 * 3 * 1).view(2, 1, 3, 1)  # [B=2, H=1, L=3, d=1]
    assert gpu_attention.packed(t, torch.tensor([2, 3])).flatten().tolist() == [0, 1, 3, 4, 5]


def test_provenance_imports_nothing_of_the_package():
    """gpu.py --before runs again with an earlier ``transformer/`` first on PYTHONPATH and records the
    checkout's commit: what reads it must not import today's package names, which that one may lack."""
    code = ("import sys, provenance; assert provenance.code_state()['commit']; "
            "print(sorted(m for m in sys.modules if m.startswith('transformer')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(gpu.__file__).parent, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_junction_bench_runs_through_on_the_cpu(tmp_path, monkeypatch):
    """benchmarks/gpu_layernorm.py end to end on the CPU (tiny shapes): each way asked for timed at its rate,
    a way that fails reported as failed while the others run."""
    real = gpu_layernorm.measure_way
    monkeypatch.setattr(gpu_layernorm, "measure_way",
                        lambda way, *a: (_ for _ in ()).throw(RuntimeError("no kernel")) if way == "static+tuned"
                        else real(way, *a))
    monkeypatch.setattr(sys, "argv", ["gpu_layernorm.py", "--device", "cpu", "--rows", "32", "--models", "tiny",
                                      "--ways", "eager,static,static+tuned", "--repeat", "2", "--results",
                                      str(tmp_path)])
    gpu_layernorm.main()
    result = json.loads((tmp_path / "gpu_layernorm.json").read_text())
    ways = result["models"]["tiny"]
    assert list(ways) == ["eager", "static", "static+tuned"]
    assert ways["static+tuned"] == {"error": "RuntimeError: no kernel"}
    d = load_config("tiny").model.d_model
    for way in ("eager", "static"):
        assert ways[way]["effective_gb_s"] == pytest.approx(16 * 32 * d / ways[way]["ms"] / 1e6, abs=0.05)
    md = (tmp_path / "gpu_layernorm.md").read_text()
    assert f"commit {result['commit']}" in md and "| tiny | static+tuned | failed: RuntimeError: no kernel |" in md


def test_the_junction_bench_computes_the_models_junction():
    """What gpu_layernorm.py times is model.residual's post-norm junction: LayerNorm(x + s) without dropout."""
    f, (w, b) = gpu_layernorm.junction(16, 1e-6, 0.0, torch.device("cpu"))
    x, s = torch.randn(4, 16), torch.randn(4, 16)
    torch.testing.assert_close(f(x, s), torch.nn.functional.layer_norm(x + s, (16,), w, b, 1e-6))


@pytest.mark.parametrize("script, args, message", [
    ("gpu_layernorm", ["--ways", "eager,fast"], "--ways: unknown fast"),
    ("gpu_layernorm", ["--rows", "0"], "--rows 0: must be at least 1"),
    ("gpu_layernorm", ["--repeat", "0"], "--repeat 0: must be at least 1"),
    ("gpu_layernorm", ["--device", "mps"], "--device mps: cuda, cuda:N or cpu"),
    ("gpu_layernorm", ["--device", "gpu"], "--device gpu: cuda, cuda:N or cpu"),
    ("gpu_layernorm", ["--models", "base,bgi"], "--models base,bgi: "),
    ("gpu_layernorm", ["--results", "FILE/sub"], "--results FILE/sub: Not a directory"),
    ("gpu_attention", ["--models", "tiny,nope"], "--models tiny,nope: "),
    ("gpu_attention", ["--results", "FILE/sub"], "--results FILE/sub: Not a directory"),
])
def test_the_benchmarks_of_a_part_refuse_bad_arguments_before_measuring(script, args, message, tmp_path, capsys,
                                                                        monkeypatch):
    """gpu_layernorm.py and gpu_attention.py check their arguments first, each refusal one line: a typo in a
    preset or the results folder found after minutes of a GPU visit loses them."""
    module = {"gpu_layernorm": gpu_layernorm, "gpu_attention": gpu_attention}[script]
    (tmp_path / "FILE").write_text("")
    monkeypatch.chdir(tmp_path)
    measured = []
    monkeypatch.setattr(module, "timed", lambda *a, **k: measured.append(a) or 1.0)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", "--device", "cpu", *args])
    with pytest.raises(SystemExit) as stop:
        module.main()
    assert stop.value.code == 2 and not measured
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"{script}.py: error: {message}"), err



def test_candidate_curves_run_as_their_rows_and_stand_beside_the_dropout_floor(monkeypatch):
    """--curve-modes on the CPU: each mode's curve is the same run drawn in that mode's context (a context that
    fails lists the mode's error, and the next mode still runs), compared with the reference curve, beside that
    curve's own run with its dropout masks drawn again."""
    batches = gpu.synthetic_batches(256, 200, copy=True)[0]
    plain = gpu.loss_curve("tiny", "fp32", batches, 3, device="cpu")

    def refused(on: bool):
        if on:
            raise RuntimeError("no memory-efficient kernel here")
        return gpu.contextlib.nullcontext()
    monkeypatch.setattr(gpu, "attention_preferring_efficient", refused)
    same, failed, bf16 = gpu.curve_candidates("fp32,bf16+compile+efficient,bf16", batches, plain, "tiny", "cpu")
    assert same["mode"] == "fp32" and same["max_rel_diff"] == 0.0 and same["within"]  # the same run, drawn again
    assert failed == {"mode": "bf16+compile+efficient", "error": "RuntimeError: no memory-efficient kernel here"}
    assert bf16["mode"] == "bf16" and 0.0 < bf16["first_step_rel_diff"] < 1e-1  # the same weights, bf16's rounding
    floor = same["floor_dropout"]
    assert floor == bf16["floor_dropout"] and floor["max_rel_diff"] > 0.0  # other masks move the curve
    lines = "\n".join(gpu.candidate_lines([same, failed, bf16]))
    assert "| bf16+compile+efficient | failed: RuntimeError: no memory-efficient kernel here |" in lines
    assert "| fp32 | 3 | 0.00e+00 (1) |" in lines


def test_the_issues_batches_pad_their_sources_as_synthetic_batches_says():
    """The batches gpu.py measures at the paper's 25k tokens (its own count of sentences), as the docstring
    describes them for whoever reads an MFU off them: 568 sentences a batch, targets 42-44 long and nearly
    unpadded, sources padded to 44 positions with a third or more of them padding."""
    batches = gpu.synthetic_batches(25_000, 16 * 25_000 // 27)[0]
    assert batches and {gpu.shape(b)[:2] for b in batches} == {(568, 44)}
    for b in batches:
        assert 42 <= b.tgt_in.shape[1] <= 44 and 1 - b.n_tgt_tokens / b.tgt_out.numel() < 0.03
        assert 0.33 < 1 - b.n_src_tokens / b.src.numel() < 0.43


@pytest.mark.slow
def test_the_decode_visits_before_package_reads_a_run_of_todays(tiny_run, tmp_path):
    """gpu_decode.py's "before" (979b027, issue 43's) refused the quick model's config, keys added since
    (train.init_qkv_gain, ..., precision "auto"): the visit's first measurement failed and ended the script.
    Its worker reads the run through a copy whose configs hold what that package knows."""
    root = Path(__file__).resolve().parents[1]
    before = tmp_path / "before"
    before.mkdir()
    archive = subprocess.run(["git", "-C", str(root), "archive", "979b027", "transformer", "configs"],
                             capture_output=True)
    if archive.returncode:
        pytest.skip(f"979b027 is not in this clone's history: {archive.stderr.decode()[:200]}")
    subprocess.run(["tar", "-x", "-C", str(before)], input=archive.stdout, check=True)
    lines = tmp_path / "test.en"
    lines.write_text("A dog runs.\nTwo men are talking.\n")
    for code in (before, root):  # the old package, and today's through the same copy
        done = subprocess.run([sys.executable, str(root / "benchmarks" / "gpu_decode.py"), "--worker", str(tiny_run),
                               "2", "2", "1", "cpu", str(lines)], capture_output=True, text=True, cwd=root,
                              env={**os.environ, "PYTHONPATH": f"{code}:{root / 'benchmarks'}"})
        assert done.returncode == 0, done.stderr[-2000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["code"] == str(code / "transformer") and result["sentences"] == 2
    assert not [p for p in tiny_run.parent.iterdir() if p.name.startswith(f"{tiny_run.name}.")]  # copies removed
