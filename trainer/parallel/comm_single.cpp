#include <cstring>

#include "core/error.h"
#include "trainer/parallel/comm.h"

namespace weft::parallel {

int64_t dtype_bytes(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

namespace {

class SingleRankComm final : public Comm {
 public:
  int64_t size() const override { return 1; }
  int64_t rank() const override { return 0; }
  std::string name() const override { return "single"; }
  void all_reduce(void*, int64_t, DType, ReduceOp) override {}
  void all_gather(const void* in, void* out, int64_t count, DType t) override { copy(in, out, count, t); }
  void reduce_scatter(const void* in, void* out, int64_t count, DType t) override {
    copy(in, out, count, t);
  }
  void broadcast(void*, int64_t, DType, int64_t root) override { WEFT_ASSERT(root == 0); }
  void send(const void*, int64_t, DType, int64_t, int64_t) override {
    throw InternalError("send on a single-rank group");
  }
  void recv(void*, int64_t, DType, int64_t, int64_t) override {
    throw InternalError("recv on a single-rank group");
  }
  void barrier() override {}

 private:
  static void copy(const void* in, void* out, int64_t count, DType t) {
    if (in != out) std::memmove(out, in, size_t(count * dtype_bytes(t)));
  }
};

}  // namespace

std::unique_ptr<Comm> single_rank_comm() { return std::make_unique<SingleRankComm>(); }

}  // namespace weft::parallel

#include "trainer/parallel/process_groups.h"

namespace weft::parallel {

ProcessGroups single_process_groups() {
  ProcessGroups g;
  for (int i = 0; i < 4; ++i) g.owned.push_back(single_rank_comm());
  g.world = g.owned[0].get();
  g.tp = g.owned[1].get();
  g.pp = g.owned[2].get();
  g.dp = g.owned[3].get();
  return g;
}

}  // namespace weft::parallel
