"""benchmarks/gpu.py's profile summary (issue 47): kernels sorted into kinds by name, per-step sums.
The profile itself needs a CUDA GPU; what it does with the kernels it finds is checked here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu  # noqa: E402

# names as torch.profiler reports them on an H100 (shortened where they run on)
KERNELS = {
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0": "attention",
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128>>": "attention",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas": "matmul",
    "nvjet_tst_192x192_64x4_2x1_v_bz_coopA_TNT": "matmul",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(Params)": "matmul",
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}> >(int, ...)": "copies",
    "void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul> >(int, ...)": "copies",
    "triton_poi_fused__to_copy_add_native_dropout_3": "copies",
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
    assert s["top_kernels"][0] == {"name": "sm90_xmma_gemm_bf16", "kind": "matmul", "ms_per_step": 7.5}
    assert gpu.kernel_summary(kernels, steps=4, step_ms=10.0)["gpu_busy"] == 1.0  # capped: one stream
