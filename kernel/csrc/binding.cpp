// Thin torch binding: checks tensor metadata (never device data, so no host sync), then enqueues the kernels
// on the current stream. The launch plan (row groups, splits, chunk) comes from Python (kdtree_kernel.plan).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <optional>
#include <string>

#include "verify_attention.h"

namespace {

// Messages are built with std::to_string, never by streaming a number into TORCH_CHECK: on the H200 machine
// (torch 2.11) a failed check whose message streams an integer killed the process with SIGSEGV instead of raising
// (kernel/bench/probe_binding_checks.py; the same checks with std::to_string raise a RuntimeError).
std::string num(int64_t v) { return std::to_string(v); }

void check_cuda(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
}

void check_int32_vector(const at::Tensor& t, const char* name) {
  check_cuda(t, name);
  TORCH_CHECK(t.dim() == 1 && t.scalar_type() == at::kInt && t.is_contiguous(), name,
              " must be a contiguous int32 vector");
}

void verify_attention_launch(const at::Tensor& q, const at::Tensor& kv_buffer, const at::Tensor& kv_indptr,
                             const at::Tensor& kv_indices, const at::Tensor& qo_indptr,
                             const at::Tensor& draft_mask, const at::Tensor& out,
                             const std::optional<at::Tensor>& lse, const std::optional<at::Tensor>& workspace,
                             double sm_scale, int64_t q_len, int64_t row_groups, int64_t row_blocks,
                             int64_t splits, int64_t chunk_keys, bool split_schedulers, double k_scale,
                             double v_scale) {
  check_cuda(q, "q");
  TORCH_CHECK(q.dim() == 3 && q.size(2) == kdtree::kHeadDim && q.stride(2) == 1 && q.scalar_type() == at::kBFloat16,
              "q must be bf16 [T, H, 576] with a contiguous last dim");
  check_cuda(kv_buffer, "kv_buffer");
  const bool fp8 = kv_buffer.scalar_type() == at::kFloat8_e4m3fn;
  TORCH_CHECK(kv_buffer.scalar_type() == at::kBFloat16 || fp8,
              std::string("kv_buffer must be bf16 or float8_e4m3fn, got ") + c10::toString(kv_buffer.scalar_type()));
  // 16-byte cp.async pieces: the pool's base and row stride must keep every row 16-byte aligned.
  TORCH_CHECK(reinterpret_cast<uintptr_t>(kv_buffer.data_ptr()) % 16 == 0 &&
                  (kv_buffer.stride(0) * kv_buffer.element_size()) % 16 == 0,
              "kv_buffer rows must be 16-byte aligned");
  TORCH_CHECK(k_scale > 0.0 && v_scale > 0.0, "k_scale and v_scale must be positive");
  TORCH_CHECK((kv_buffer.dim() == 2 || (kv_buffer.dim() == 3 && kv_buffer.size(1) == 1)) &&
                  kv_buffer.size(-1) == kdtree::kHeadDim && kv_buffer.stride(-1) == 1,
              "kv_buffer must be [pool, 576] or [pool, 1, 576] with a contiguous last dim");
  check_int32_vector(kv_indptr, "kv_indptr");
  check_int32_vector(qo_indptr, "qo_indptr");
  check_cuda(kv_indices, "kv_indices");
  TORCH_CHECK(kv_indices.dim() == 1 && kv_indices.is_contiguous() &&
                  (kv_indices.scalar_type() == at::kInt || kv_indices.scalar_type() == at::kLong),
              "kv_indices must be a contiguous int32 or int64 vector");
  TORCH_CHECK(sm_scale > 0.0, "sm_scale must be positive, got " + std::to_string(sm_scale));
  const int64_t tokens = q.size(0);
  const int64_t heads = q.size(1);
  const int64_t bs = qo_indptr.size(0) - 1;
  TORCH_CHECK(kv_indptr.size(0) == bs + 1, "kv_indptr and qo_indptr must both have bs + 1 entries");
  TORCH_CHECK(q_len >= 1 && q_len <= kdtree::kMaxQLen, "q_len must be in [1, " + num(kdtree::kMaxQLen) + "]");
  TORCH_CHECK(tokens == bs * q_len, "q has " + num(tokens) + " tokens, expected bs * q_len = " + num(bs * q_len));
  check_cuda(draft_mask, "draft_mask");
  const int64_t words = (q_len + 63) / 64;
  TORCH_CHECK(draft_mask.scalar_type() == at::kLong && draft_mask.dim() == 2 && draft_mask.size(0) == tokens &&
                  draft_mask.size(1) == words && draft_mask.is_contiguous(),
              "draft_mask must be contiguous int64 [T, ceil(q_len / 64)]");
  check_cuda(out, "out");
  TORCH_CHECK(out.scalar_type() == at::kBFloat16 && out.is_contiguous() && out.numel() == tokens * heads * kdtree::kValueDim,
              "out must be contiguous bf16 [T, H, 512]");
  float* lse_ptr = nullptr;
  if (lse.has_value()) {
    check_cuda(*lse, "lse");
    TORCH_CHECK(lse->scalar_type() == at::kFloat && lse->is_contiguous() && lse->numel() == tokens * heads,
                "lse must be contiguous float32 [T, H]");
    lse_ptr = lse->data_ptr<float>();
  }
  const int64_t rows = q_len * heads;
  void* part_o = nullptr;
  float* part_lse = nullptr;
  if (splits > 1) {
    TORCH_CHECK(workspace.has_value(), "splits > 1 needs a workspace (kdtree_kernel.workspace_size)");
    check_cuda(*workspace, "workspace");
    const int64_t need = bs * splits * rows * kdtree::kPartialRowBytes;
    TORCH_CHECK(workspace->is_contiguous() && workspace->numel() * workspace->element_size() >= need,
                "workspace too small: need " + num(need) + " bytes");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(workspace->data_ptr()) % 16 == 0, "workspace must be 16-byte aligned");
    // bf16 partial rows, then the fp32 LSEs (4-byte aligned: 1024 bytes a row before them).
    part_o = workspace->data_ptr();
    part_lse = reinterpret_cast<float*>(static_cast<char*>(part_o) + bs * splits * rows * kdtree::kValueDim * 2);
  }

  kdtree::VerifyParams p{};
  p.q = q.data_ptr();
  p.q_stride_token = q.stride(0);
  p.q_stride_head = q.stride(1);
  p.kv = kv_buffer.data_ptr();
  p.kv_row_stride = kv_buffer.stride(0);
  p.kv_indptr = kv_indptr.data_ptr<int32_t>();
  p.kv_indices = kv_indices.data_ptr();
  p.kv_index_count = kv_indices.numel();
  p.indices_are_int64 = kv_indices.scalar_type() == at::kLong ? 1 : 0;
  p.kv_fp8 = fp8 ? 1 : 0;
  p.qo_indptr = qo_indptr.data_ptr<int32_t>();
  p.draft_mask = reinterpret_cast<const uint64_t*>(draft_mask.data_ptr<int64_t>());
  p.mask_words = static_cast<int>(words);
  p.out = out.data_ptr();
  p.lse = lse_ptr;
  p.part_o = part_o;
  p.part_lse = part_lse;
  p.bs = static_cast<int>(bs);
  p.heads = static_cast<int>(heads);
  p.q_len = static_cast<int>(q_len);
  p.row_groups = static_cast<int>(row_groups);
  p.row_blocks = static_cast<int>(row_blocks);
  p.splits = static_cast<int>(splits);
  p.chunk_keys = static_cast<int>(chunk_keys);
  p.split_schedulers = split_schedulers ? 1 : 0;
  // Scores use the pool's keys times k_scale; the fp8 path's Q is prescaled by 2^-kFp8QShift (kernel header).
  const double q_unscale = fp8 ? static_cast<double>(1 << kdtree::kFp8QShift) : 1.0;
  p.scale_log2 = static_cast<float>(sm_scale * k_scale * q_unscale * 1.4426950408889634);
  p.out_scale = static_cast<float>(v_scale);

  const c10::cuda::CUDAGuard guard(q.device());
  const cudaError_t err = kdtree::launch_verify_attention(p, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "kdtree verify_attention launch failed: ", cudaGetErrorString(err));
}

int64_t blocks_per_sm(int64_t row_groups, bool fp8) {
  return kdtree::verify_blocks_per_sm(static_cast<int>(row_groups), fp8);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "kdtree DDTree verify-attention CUDA kernels";
  m.def("verify_attention", &verify_attention_launch, "Enqueue the verify attention (no sync, no allocation)");
  m.def("blocks_per_sm", &blocks_per_sm, "Resident blocks per SM for a row-group count (bf16 or fp8 pool)",
        pybind11::arg("row_groups"), pybind11::arg("fp8") = false);
  m.attr("max_q_len") = kdtree::kMaxQLen;
  m.attr("max_row_groups") = kdtree::kMaxRowGroups;
  m.attr("chunk_align") = kdtree::kChunkAlign;
}
