// The op-test registry: named cases per kernel family with odd shapes (5, 13,
// 113; 3, 37; GQA groups of 2 and 4), shared by the CPU tests here, the GPU
// tests (CUDA vs CPU) and the kernel benchmarks. Shapes are small enough for
// finite differences; a case that needs a bigger shape to reach a code path
// says so in its name: T = 113 walks several attention query blocks of 32
// and T = 130 ends on a block of 2 rows, C = 130 three column blocks, and
// "parallel" cases pass the CPU kernels' threshold for running a loop on
// several threads (cpu::kParallelMinWork).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/rope_scaling.h"
#include "kernels/gemm/gemm.h"

namespace weft::kernels::test {

struct GemmCase {
  std::string name;
  Trans trans_a, trans_b;
  int64_t m, n, k;
  int64_t batch;
  double alpha, beta;
};

struct AttentionCase {
  std::string name;
  int64_t B, T, H, H_kv, D;
};

struct NormCase {
  std::string name;
  int64_t rows, C;
  double eps;
};

struct RopeCase {
  std::string name;
  int64_t B, T, H, H_kv, D;
  int64_t position_offset;
  double theta;
  RopeScaling scaling = {};  // none: plain RoPE
};

struct SwigluCase {
  std::string name;
  int64_t rows, F;
};

struct EmbeddingCase {
  std::string name;
  int64_t rows, C, V;
  int64_t shards;  // tp ranks the vocabulary is split over (uneven when V % shards != 0)
};

struct CrossEntropyCase {
  std::string name;
  int64_t rows, V;
  int64_t shards;        // tp ranks
  int64_t ignore_every;  // every k-th row's target is the ignore index (0: none)
  double logit_range;    // logits uniform in [-range, range]
};

struct AdamwCase {
  std::string name;
  std::vector<int64_t> sizes;  // one tensor per size; odd-indexed ones skip weight decay
  int64_t step;
  double weight_decay;
  double grad_scale;
};

struct ElementwiseCase {
  std::string name;
  int64_t n;
};

const std::vector<GemmCase>& gemm_cases();
const std::vector<AttentionCase>& attention_cases();
const std::vector<NormCase>& norm_cases();
const std::vector<RopeCase>& rope_cases();
const std::vector<SwigluCase>& swiglu_cases();
const std::vector<EmbeddingCase>& embedding_cases();
const std::vector<CrossEntropyCase>& cross_entropy_cases();
const std::vector<AdamwCase>& adamw_cases();
const std::vector<ElementwiseCase>& elementwise_cases();

// Rows [start, start + size) of shard `rank` when n rows split over `shards`
// ranks as evenly as possible (the first n % shards ranks get one more).
struct Shard {
  int64_t start, size;
};
Shard shard_of(int64_t n, int64_t shards, int64_t rank);

// GoogleTest prints parameters through these, and names instances by case.
inline void PrintTo(const GemmCase& c, std::ostream* os) { *os << c.name; }
inline void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }
inline void PrintTo(const NormCase& c, std::ostream* os) { *os << c.name; }
inline void PrintTo(const RopeCase& c, std::ostream* os) { *os << c.name; }
inline void PrintTo(const SwigluCase& c, std::ostream* os) { *os << c.name; }
inline void PrintTo(const EmbeddingCase& c, std::ostream* os) { *os << c.name; }
inline void PrintTo(const CrossEntropyCase& c, std::ostream* os) { *os << c.name; }
inline void PrintTo(const AdamwCase& c, std::ostream* os) { *os << c.name; }
inline void PrintTo(const ElementwiseCase& c, std::ostream* os) { *os << c.name; }
struct CaseName {
  template <typename Info>
  std::string operator()(const Info& info) const {
    return info.param.name;
  }
};

}  // namespace weft::kernels::test
