// The layout-parity harness shared by the mpirun parity tests: a tiny GQA
// Llama on byte data, trained from one seed under a layout on its world
// size, its losses read back, and each rank's arena checked against the
// memory model per category.
#pragma once

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../e2e/cli_runner.h"
#include "../unit/test_util.h"

namespace weft::test {

// V=256 (byte data), C=64, F=128, L=8, H=8, H_kv=4: tp up to 4, pp up to 8.
inline constexpr const char* kConfig = R"({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
  "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 8,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false})";

struct Fixture {
  TempDir dir;
  std::string data, config;
  int64_t seq = 16, global_batch = 8, steps = 5;
  explicit Fixture(bool tied = false, std::string model = kConfig) {
    std::string text;
    for (int i = 0; i < 300; ++i)
      text += "Parallel layouts must agree " + std::to_string(i * 7919 % 1000) + " times over.\n%\n";
    const auto in = dir.file("c.txt", text);
    data = dir.path("data");
    std::string cfg = std::move(model);
    if (tied) cfg.replace(cfg.find("false"), 5, "true");
    config = dir.file("model/config.json", cfg);
    const auto r = run_weft("data prepare --input " + in + " --out " + data + " --val-fraction 0.1");
    EXPECT_EQ(r.code, 0) << r.out;
  }
  // The last train()'s balancing losses (MoE models) and gradient norms, a
  // step each.
  std::vector<double> aux_losses, grad_norms;
  // Trains under `layout` on its world size; returns the metrics file's losses.
  std::vector<double> train(const std::string& layout, const std::string& out, const std::string& extra = "") {
    aux_losses.clear();
    grad_norms.clear();
    const std::regex axis("(?:^|-)(tp|cp|pp|dp)(\\d+)");
    int64_t world = 1;
    for (auto it = std::sregex_iterator(layout.begin(), layout.end(), axis); it != std::sregex_iterator(); ++it)
      world *= std::stoll((*it)[2]);
    std::string cmd = fmt::format(
        "train --data {} --model {} --seq {} --global-batch {} --steps {} --warmup 2 --log-every 1 "
        "--threads 1 --eval-samples 8 --comm-timeout 120 --layout {} --out {} {}",
        data, config, seq, global_batch, steps, layout, out, extra);
    const auto r = world == 1 ? run_weft(cmd)
                              : run_mpi(world, cmd);
    EXPECT_EQ(r.code, 0) << layout << "\n" << r.out;
    std::vector<double> losses;
    std::ifstream in(out + "/metrics.jsonl");
    double peak = 0;
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["kind"] == "run") {
        EXPECT_EQ(j["world"], world) << layout;
        peak = j["peak_flops"].get<double>();
      }
      if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
      if (j.contains("aux_loss")) aux_losses.push_back(j["aux_loss"].get<double>());
      if (j["kind"] == "train" && j.contains("grad_norm")) grad_norms.push_back(j["grad_norm"].get<double>());
      // Throughput per device, as the tuner and MFU count it: never summed over the ranks.
      if (j["kind"] == "train") {
        EXPECT_NEAR(j["tflops_per_device"].get<double>() * 1e12 / (j["mfu"].get<double>() * peak), 1.0, 1e-9)
            << layout;
      }
    }
    return losses;
  }
  static CliResult run_mpi(int64_t np, const std::string& args) {
    // run_weft prefixes the weft binary; mpirun goes in front of it.
    return run_shell(fmt::format("{} --oversubscribe -np {} {} {} 2>&1", MPIEXEC, np, WEFT_BIN, args));
  }
};

inline double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / std::fabs(b[i]));
  return a.size() == b.size() ? worst : INFINITY;
}

// Trains `layout`, checks its losses against `ref` (relative `tol`; the
// first step's within `first_tol`) and every rank's measured arena against
// the memory model per category (5%), and returns a row of the printed table.
inline std::string parity_row(Fixture& f, const std::vector<double>& ref, const std::string& layout, double tol = 1e-5,
                       double first_tol = 1e-5, const std::string& extra = "") {
  const auto out = f.dir.path("run-" + layout + (extra.empty() ? "" : fmt::format("-{:x}", std::hash<std::string>{}(extra))));
  const auto losses = f.train(layout, out, extra);
  const double dev = max_rel(losses, ref);
  EXPECT_LE(dev, tol) << layout;
  if (!losses.empty() && !ref.empty()) {
    EXPECT_LE(std::fabs(losses[0] - ref[0]) / ref[0], first_tol) << layout;
  }
  double worst_mem = 0;
  int64_t ranks = 0;
  for (const auto& e : std::filesystem::directory_iterator(out + "/memory")) {
    ++ranks;
    std::ifstream in(e.path());
    const auto j = nlohmann::json::parse(in);
    for (const auto& [cat, predicted] : j["predicted"].items()) {
      const double m = j["measured"][cat].get<double>(), p = predicted.get<double>();
      if (p == 0 && m == 0) continue;
      const double d = p > 0 ? std::fabs(m - p) / p : 1.0;
      worst_mem = std::max(worst_mem, d);
      EXPECT_LE(d, 0.05) << layout << " rank " << j["rank"] << " " << cat;
    }
  }
  return fmt::format("{:<62} {:>5} {:>12.2e} {:>13.2f}%\n", layout, ranks, dev, 100 * worst_mem);
}

// parity_row for each layout, under a header: the table the tests print.
inline std::string parity_table(Fixture& f, const std::vector<double>& ref, const std::vector<std::string>& layouts) {
  std::string table = fmt::format("{:<62} {:>5} {:>12} {:>14}\n", "layout", "ranks", "max rel dev", "worst mem dev");
  for (const auto& layout : layouts) table += parity_row(f, ref, layout);
  return table;
}

// Each case saves a checkpoint at step 3 under its first layout and resumes
// it under each of the others: steps 4 and 5 must give the reference's
// losses within 1e-5.
using ReshardCases = std::vector<std::pair<std::string, std::vector<std::string>>>;
inline void expect_reshards(Fixture& f, const std::vector<double>& ref, const ReshardCases& cases) {
  for (const auto& [from, tos] : cases) {
    const auto saved = f.dir.path("a-" + from);
    f.train(from, saved, "--ckpt-every 3");
    const auto ckpt = saved + "/checkpoints/step_000003";
    for (const auto& to : tos) {
      const auto losses = f.train(to, f.dir.path("b-" + from + "-" + to), "--resume-from " + ckpt);
      ASSERT_EQ(losses.size(), 2u) << from << " -> " << to;
      for (size_t i = 0; i < 2; ++i)
        EXPECT_NEAR(losses[i], ref[3 + i], 1e-5 * ref[3 + i]) << from << " -> " << to << " step " << 4 + i;
    }
  }
}

}  // namespace weft::test
