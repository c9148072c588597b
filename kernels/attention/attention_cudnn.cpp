// The cudnn attention kind: graphs of cuDNN's fused SDPA built, cached and
// executed (what they compute, their layout and their workspace bound are in
// attention_cudnn.h). Compiled only in CUDA builds that found the cuDNN
// frontend; CMake defines CUDNN_FRONTEND_SKIP_JSON_LIB for this file, so the
// frontend's bundled copy of nlohmann::json does not meet the system copy
// weft's core uses in the same binary.
#include "kernels/attention/attention_cudnn.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda_check.h"

namespace weft::kernels {
namespace gpu {

inline std::string describe(cudnnStatus_t status) {
  if (status == CUDNN_STATUS_SUCCESS) return {};
  return cudnnGetErrorString(status);
}

}  // namespace gpu

#define CUDNN_CHECK(call) WEFT_CUDA_CALL_CHECK("cuDNN", call)

namespace attention_cudnn {
namespace {

namespace fe = cudnn_frontend;

// Tensor ids of the variant packs, shared by both directions.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

enum class Direction { forward, backward };

// A graph's shape: T queries against Tk keys, each tensor's batch row
// stride (q and out and dout: q_rows; k and v: kv_rows; lse: lse_rows; the
// backward's outputs: dq_rows, dkv_rows) and the mask (attention_cudnn.h).
struct Key {
  int64_t B, T, Tk, H, H_kv, D;
  int64_t q_rows, kv_rows, lse_rows, dq_rows, dkv_rows;
  Mask mask;
  Direction direction;
  auto operator<=>(const Key&) const = default;
};

// 0 rows: dense.
int64_t rows_or(int64_t rows, int64_t dense) { return rows > 0 ? rows : dense; }

// A built graph, or why there is none: the step that failed and cuDNN's
// message (remembered, so a refused shape is not rebuilt at every launch).
struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  const char* stage = nullptr;
  std::string why;
  // cuDNN has no plan for the graph on this device (rather than weft
  // describing it wrongly or the library failing).
  bool unsupported = false;
};

// One device's handle and graphs. Graph::execute is safe from several
// threads, but a handle carries one stream, so setting it and enqueuing
// happen under the lock.
struct DeviceState {
  std::mutex mu;
  cudnnHandle_t handle = nullptr;  // never destroyed: the context may be gone at exit
  std::map<Key, Built> graphs;
};

DeviceState& device_state() {
  static std::mutex mu;
  static std::deque<DeviceState> states;  // a deque: growing it keeps the others' addresses
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  while (states.size() <= size_t(device)) states.emplace_back();
  return states[size_t(device)];
}

// (B, rows, heads, D) memory, `len` of each sequence's rows, as cuDNN's
// (B, heads, len, D).
fe::graph::Tensor_attributes bthd(const char* name, Uid uid, const Key& k, int64_t heads, int64_t len,
                                  int64_t rows) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({k.B, heads, len, k.D})
      .set_stride({rows * heads * k.D, k.D, heads * k.D, 1});
}

void set_bthd(fe::graph::Tensor_attributes& t, Uid uid, const Key& k, int64_t heads, int64_t len, int64_t rows) {
  t.set_output(true).set_uid(uid).set_dim({k.B, heads, len, k.D}).set_stride({rows * heads * k.D, k.D, heads * k.D, 1});
}

// lse (B, H, lse_rows) fp32, T of each row's, as cuDNN's stats, (B, H, T, 1).
void set_stats(fe::graph::Tensor_attributes& t, const Key& k) {
  t.set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({k.B, k.H, k.T, 1})
      .set_stride({k.H * k.lse_rows, k.lse_rows, 1, 1});
}

// The mask on an SDPA's attributes: causal with the band's right edge on
// the diagonal from the top left where T == Tk, from the bottom right where
// the queries are the keys' last T; none where every key is visible.
template <typename A>
A& masked(A& attrs, const Key& k) {
  if (k.mask == Mask::causal)
    attrs
        .set_diagonal_alignment(k.T == k.Tk ? fe::DiagonalAlignment_t::TOP_LEFT
                                            : fe::DiagonalAlignment_t::BOTTOM_RIGHT)
        .set_diagonal_band_right_bound(0);
  return attrs;
}

// sm > 0: for that compute capability instead of the current device's.
std::shared_ptr<fe::graph::Graph> describe_graph(const Key& k, int sm) {
  auto g = std::make_shared<fe::graph::Graph>();
  if (sm > 0) g->set_sm_version(sm);
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const float scale = 1.f / std::sqrt(float(k.D));
  auto q = g->tensor(bthd("Q", kQ, k, k.H, k.T, k.q_rows));
  auto kk = g->tensor(bthd("K", kK, k, k.H_kv, k.Tk, k.kv_rows));
  auto v = g->tensor(bthd("V", kV, k, k.H_kv, k.Tk, k.kv_rows));
  // Causal: key j is visible to query i when its position is at or before
  // the query's (masked above).
  if (k.direction == Direction::forward) {
    auto attrs = fe::graph::SDPA_attributes().set_name("weft_sdpa").set_generate_stats(true).set_attn_scale(scale);
    auto [o, stats] = g->sdpa(q, kk, v, masked(attrs, k));
    set_bthd(*o, kO, k, k.H, k.T, k.q_rows);
    stats->set_output(true);
    set_stats(*stats, k);
  } else {
    auto o = g->tensor(bthd("O", kO, k, k.H, k.T, k.q_rows));
    auto d_o = g->tensor(bthd("dO", kDO, k, k.H, k.T, k.q_rows));
    fe::graph::Tensor_attributes s;
    s.set_name("Stats");
    set_stats(s, k);
    auto stats = g->tensor(s);
    auto attrs = fe::graph::SDPA_backward_attributes().set_name("weft_sdpa_backward").set_attn_scale(scale);
    auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, d_o, stats, masked(attrs, k));
    set_bthd(*dq, kDQ, k, k.H, k.T, k.dq_rows);
    set_bthd(*dk, kDK, k, k.H_kv, k.Tk, k.dkv_rows);
    set_bthd(*dv, kDV, k, k.H_kv, k.Tk, k.dkv_rows);
  }
  return g;
}

// cuDNN's part of the bound (the accumulating backward's bf16 gradients
// come after it: attention.cu).
int64_t bound_of(const Key& k) {
  return k.direction == Direction::forward ? forward_workspace_bound(k.B, k.T, k.H, k.H_kv, k.D)
                                           : backward_workspace_bound(k.B, k.T, k.H, k.H_kv, k.D, k.Tk);
}

int64_t engine_allowance_of(const Key& k) {
  return k.direction == Direction::forward ? kEngineAllowance
                                           : backward_engine_allowance(k.B, k.T, k.H, k.H_kv, k.D, k.Tk);
}

// The graph of a key, described (the frontend's attribute checks throw,
// which comes back as INVALID_VALUE) and validated; sm as describe_graph.
fe::error_t describe_and_validate(const Key& k, int sm, std::shared_ptr<fe::graph::Graph>& g) {
  try {
    g = describe_graph(k, sm);
  } catch (const std::exception& e) {
    return fe::error_t{fe::error_code_t::INVALID_VALUE, e.what()};
  }
  return g->validate();
}

// Validation, heuristics (mode A, the frontend's default), support check and
// the plan. cap < 0: no limit on the engine's workspace.
Built try_build(const Key& k, cudnnHandle_t handle, int64_t cap) {
  Built b;
  auto failed = [&](const char* stage, fe::error_t e) {
    b.stage = stage;
    b.why = e.get_message();
    const fe::error_code_t code = e.get_code();
    b.unsupported = code == fe::error_code_t::GRAPH_NOT_SUPPORTED ||
                    code == fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED ||
                    code == fe::error_code_t::HEURISTIC_QUERY_FAILED;
    return b;
  };
  std::shared_ptr<fe::graph::Graph> g;
  if (auto e = describe_and_validate(k, 0, g); e.is_bad()) return failed("validate", e);
  if (auto e = g->build_operation_graph(handle); e.is_bad()) return failed("build_operation_graph", e);
  if (cap >= 0) g->deselect_workspace_greater_than(cap);
  if (auto e = g->create_execution_plans({fe::HeurMode_t::A}); e.is_bad()) return failed("create_execution_plans", e);
  if (auto e = g->check_support(); e.is_bad()) return failed("check_support", e);
  if (auto e = g->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE); e.is_bad()) return failed("build_plans", e);
  if (auto e = g->get_workspace_size(b.workspace); e.is_bad()) return failed("get_workspace_size", e);
  b.graph = std::move(g);
  return b;
}

std::string shape_text(const Key& k) {
  std::string s = fmt::format("cuDNN SDPA {} B {} T {} H {} H_kv {} D {}",
                              k.direction == Direction::forward ? "forward" : "backward", k.B, k.T, k.H, k.H_kv, k.D);
  if (k.Tk != k.T || k.mask != Mask::causal) s += fmt::format(" Tk {} ({})", k.Tk, k.mask == Mask::causal ? "causal" : "visible");
  return s;
}

// The graph of a key, built on first use. With the engine capped, a graph
// that only builds uncapped means the allowance is too small; that and a
// built graph above the whole bound are weft's bugs (attention_cudnn.h).
const Built& graph_for(DeviceState& s, const Key& k) {
  if (auto it = s.graphs.find(k); it != s.graphs.end()) return it->second;
  Built b = try_build(k, s.handle, engine_allowance_of(k));
  if (!b.graph && b.unsupported) {
    const Built uncapped = try_build(k, s.handle, -1);
    if (uncapped.graph)
      throw InternalError(fmt::format(
          "{}: every cuDNN plan needs more engine workspace than weft's allowance of {} bytes (the plan "
          "cuDNN would pick needs {} bytes in all); raise the allowance in kernels/attention/attention_cudnn.h "
          "and the memory model's bound in memory/shapes.cpp",
          shape_text(k), engine_allowance_of(k), uncapped.workspace));
  } else if (b.workspace > bound_of(k)) {
    throw InternalError(fmt::format(
        "{}: the built graph needs {} bytes of workspace, above weft's bound of {} bytes; the frontend "
        "lays out more than kernels/attention/attention_cudnn.h assumes",
        shape_text(k), b.workspace, bound_of(k)));
  }
  return s.graphs.emplace(k, std::move(b)).first->second;
}

// cuDNN 9 or newer at run time: the frontend's SDPA backward switches to a
// T^2 workspace layout on 8.9.x, which the bound does not cover.
bool cudnn_9_loaded() {
  static const bool yes = cudnnGetVersion() >= 90000;
  return yes;
}

Status execute(const Key& k, std::unordered_map<int64_t, void*>& pack, Workspace ws, cudaStream_t stream) {
  if (!cudnn_9_loaded())
    gpu::throw_call_error("cuDNN", "cudnnGetVersion",
                          fmt::format("{}: the cuDNN loaded is version {}; attn:cudnn needs cuDNN 9 or newer "
                                      "(attn:flash and attn:materialized need no cuDNN)",
                                      shape_text(k), cudnnGetVersion()),
                          __FILE__, __LINE__);
  DeviceState& s = device_state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.handle == nullptr) CUDNN_CHECK(cudnnCreate(&s.handle));
  const Built& b = graph_for(s, k);
  if (!b.graph)
    gpu::throw_call_error("cuDNN frontend", b.stage,
                          fmt::format("{}: {}: {}", shape_text(k),
                                      b.unsupported ? "cuDNN has no plan for this shape on this device (use "
                                                      "attn:flash or attn:materialized)"
                                                    : "the graph could not be built",
                                      b.why),
                          __FILE__, __LINE__);
  CUDNN_CHECK(cudnnSetStream(s.handle, stream));
  if (auto e = b.graph->execute(s.handle, pack, b.workspace > 0 ? ws.data : nullptr); e.is_bad())
    gpu::throw_call_error("cuDNN frontend", "Graph::execute", shape_text(k) + ": " + e.get_message(), __FILE__,
                          __LINE__);
  gpu::launch_check(stream, "cuDNN SDPA", __FILE__, __LINE__);
  return Status::ok;
}

void* mut(const void* p) { return const_cast<void*>(p); }

// The key of a call (its mask as block_mask says: attention.cu takes no
// other block for cudnn).
Key key_of(int64_t B, int64_t T, int64_t Tk, int64_t H, int64_t H_kv, int64_t D, int64_t q_offset, int64_t k_offset,
           int64_t q_rows, int64_t kv_rows, int64_t lse_rows, int64_t dq_rows, int64_t dkv_rows, Direction d) {
  const int64_t keys = Tk > 0 ? Tk : T;
  Mask mask = Mask::causal;
  if (!block_mask(T, keys, q_offset, k_offset, &mask))
    throw InternalError(fmt::format("cuDNN SDPA given a block it does not take: {} queries at {}, {} keys at {}", T,
                                    q_offset, keys, k_offset));
  const int64_t q = rows_or(q_rows, T), kv = rows_or(kv_rows, keys);
  return Key{B,  T,  keys, H, H_kv, D, q, kv, rows_or(lse_rows, T), rows_or(dq_rows, q), rows_or(dkv_rows, kv),
             mask, d};
}

Key key_of(const AttentionForwardParams<bf16>& p) {
  return key_of(p.B, p.T, p.Tk, p.H, p.H_kv, p.D, p.q_offset, p.k_offset, p.q_batch_rows, p.kv_batch_rows,
                p.lse_batch_rows, 0, 0, Direction::forward);
}

Key key_of(const AttentionBackwardParams<bf16>& p, int64_t dq_rows, int64_t dkv_rows) {
  return key_of(p.B, p.T, p.Tk, p.H, p.H_kv, p.D, p.q_offset, p.k_offset, p.q_batch_rows, p.kv_batch_rows,
                p.lse_batch_rows, dq_rows, dkv_rows, Direction::backward);
}

int64_t built_workspace(const Key& k) {
  DeviceState& s = device_state();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto it = s.graphs.find(k);
  return it != s.graphs.end() && it->second.graph ? it->second.workspace : -1;
}

std::string validate(const Key& k, int sm) {
  std::shared_ptr<fe::graph::Graph> g;
  auto e = describe_and_validate(k, sm, g);
  return e.is_good() ? std::string() : e.get_message();
}

}  // namespace

Status forward(const AttentionForwardParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  const Key k = key_of(p);
  std::unordered_map<int64_t, void*> pack{{kQ, mut(p.q)}, {kK, mut(p.k)},   {kV, mut(p.v)},
                                          {kO, p.out},    {kStats, p.lse}};
  return execute(k, pack, ws, stream);
}

Status backward_to(const AttentionBackwardParams<bf16>& p, int64_t dq_rows, int64_t dkv_rows, Workspace ws,
                   cudaStream_t stream) {
  if (p.lse_batch_rows != 0 && p.lse_batch_rows != p.T)
    throw InternalError("cuDNN SDPA backward given a strided lse: attention.cu packs it first");
  const Key k = key_of(p, dq_rows, dkv_rows);
  std::unordered_map<int64_t, void*> pack{{kQ, mut(p.q)},       {kK, mut(p.k)},     {kV, mut(p.v)},
                                          {kO, mut(p.out)},     {kDO, mut(p.dout)}, {kStats, mut(p.lse)},
                                          {kDQ, p.dq},          {kDK, p.dk},        {kDV, p.dv}};
  return execute(k, pack, ws, stream);
}

Status backward(const AttentionBackwardParams<bf16>& p, Workspace ws, cudaStream_t stream) {
  return backward_to(p, 0, 0, ws, stream);
}

int64_t graph_workspace(const AttentionForwardParams<bf16>& p) { return built_workspace(key_of(p)); }
int64_t graph_workspace(const AttentionBackwardParams<bf16>& p) { return built_workspace(key_of(p, 0, 0)); }

std::string validate_graph(int64_t B, int64_t T, int64_t H, int64_t H_kv, int64_t D, bool backward, int sm) {
  return validate_block_graph(B, T, T, H, H_kv, D, 0, 0, 0, 0, backward, sm);
}

std::string validate_block_graph(int64_t B, int64_t T, int64_t Tk, int64_t H, int64_t H_kv, int64_t D,
                                 int64_t q_offset, int64_t k_offset, int64_t q_rows, int64_t kv_rows, bool backward,
                                 int sm) {
  if (!block_mask(T, Tk, q_offset, k_offset, nullptr))
    return fmt::format("a block of {} queries at {} against {} keys at {} is neither causal to its end nor "
                       "fully visible",
                       T, q_offset, Tk, k_offset);
  // (The backward's stats packed, as attention.cu passes them.)
  return validate(key_of(B, T, Tk, H, H_kv, D, q_offset, k_offset, q_rows, kv_rows, backward ? 0 : q_rows, 0, 0,
                         backward ? Direction::backward : Direction::forward),
                  sm);
}

}  // namespace attention_cudnn
}  // namespace weft::kernels
