// `weft calibrate`: device profiles for the cost model.
//   weft calibrate --model M --seq T --out p.json   measures this machine: run it
//       under the same mpirun and --threads as the training it will price
//   weft calibrate --public --out calibration/profiles   fits the GPU presets'
//       profiles to the public measured runs
#include <filesystem>
#include <numeric>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/output_guard.h"
#include "calibration/measure_device.h"
#include "trainer/loop.h"
#include "calibration/fidelity.h"
#ifdef WEFT_HAVE_MPI
#include "trainer/parallel/comm_mpi.h"
#endif
#include "trainer/parallel/device_comm.h"

namespace weft::cli {

namespace {

struct CalibrateArgs {
  bool fit_public = false;
  std::string public_csv;
  std::string out;
  ModelArgs model{.model = "tiny"};
  int64_t seq = 256;
  std::vector<int64_t> tp, mb = {1, 2, 4};
  std::vector<std::string> attention = {"flash", "materialized"};
  int64_t threads = 0;
  double min_time = 0.05;
  int max_log2_bytes = 24;
  int64_t flush_mib = 0;
  std::string device = std::getenv("WEFT_DEVICE") ? std::getenv("WEFT_DEVICE") : "auto";
};

int run_fit_public(const CalibrateArgs& a) {
  const std::string csv = a.public_csv.empty() ? calibration::calibration_dir() + "/public_runs.csv" : a.public_csv;
  const std::string out = a.out.empty() ? "calibration/profiles" : a.out;
  const auto set = calibration::public_runs_load(csv);
  for (const char* family : {"a100", "hopper"}) {
    const auto p = calibration::fidelity_profile(set, family, std::filesystem::path(csv).filename().string());
    const std::string path = (std::filesystem::path(out) / (std::string(family) + ".json")).string();
    tuner::profile_save(p, path);
    int64_t rows = 0;
    for (const auto& [source, n] : p.provenance["fitted_rows"].items()) rows += n.get<int64_t>();
    fmt::print("{}: fitted to {} rows, rms error of the step time {:.1f}% -> {:.1f}%; wrote {}\n", family, rows,
               100 * p.provenance["rms_error_before"].get<double>(),
               100 * p.provenance["rms_error_after"].get<double>(), path);
  }
  return 0;
}

int run_measure(const CalibrateArgs& a) {
  const ModelSpec m = a.model.resolve();
  if (a.seq < 1) throw InputError(fmt::format("--seq {} must be positive", a.seq));
  if (!(a.min_time > 0)) throw InputError(fmt::format("--min-time {} must be a positive number of seconds", a.min_time));
  if (a.max_log2_bytes < 10 || a.max_log2_bytes > 34)
    throw InputError(fmt::format("--max-message-log2 {} must be in [10, 34]", a.max_log2_bytes));
  if (a.threads < 0) throw InputError(fmt::format("--threads {} must be 0 (every core) or positive", a.threads));
  if (a.device != "auto" && a.device != "cpu" && a.device != "gpu")
    throw InputError(fmt::format("--device {} is not valid; use auto, cpu or gpu", a.device));
  const bool gpu = a.device == "gpu" || (a.device == "auto" && gpu_count() > 0);
  DeviceSpec device;
  if (gpu) {
    if (gpu_count() == 0) throw InputError("--device gpu: no CUDA device found (or this build has no CUDA)");
    const int ordinal = int(local_rank_from_env() % gpu_count());
    gpu_select(ordinal);
    device = *gpu_detect(ordinal);
  } else {
    trainer::set_threads(a.threads);
    device = cpu_rank_share(device_preset("cpu"), local_ranks_from_env(), a.threads);
  }

  std::unique_ptr<parallel::Comm> world;
  calibration::GroupsFor groups_for;
#ifdef WEFT_HAVE_MPI
  if (under_mpi()) {
    world = parallel::mpi_world_dup("calibrate");
    if (gpu) {
#ifdef WEFT_HAVE_DEVICE_COMM
      // A profile measures a cluster's collectives: ranks sharing a GPU
      // would measure the MPI device communicator's host copies instead.
      const auto choice = parallel::device_comm_choose("auto");
      if (choice.ranks_per_device > 1)
        throw InputError(fmt::format("weft calibrate measures a cluster's collectives with one rank per GPU, but {} "
                                     "ranks share a GPU here; start one rank per GPU, or one rank",
                                     choice.ranks_per_device));
      groups_for = [kind = choice.kind](const Layout& l) { return parallel::device_process_groups(kind, l, nullptr); };
#else
      throw InputError("calibrating several GPUs needs NCCL, which this build lacks");
#endif
    } else {
      groups_for = [](const Layout& l) { return parallel::mpi_process_groups(l); };
    }
  }
#endif
  if (!world) world = parallel::single_rank_comm();
  const bool rank0 = world->rank() == 0;

  // The profile it will write: checked before anything is measured.
  const std::string out = a.out.empty() ? "device-profile.json" : a.out;
  output_check(out, OutputKind::device_profile, {a.model.model}, "--out");

  calibration::DeviceCalibration c;
  c.model = m;
  c.run = RunSpec{a.seq, 1, gpu ? Precision::bf16 : Precision::fp32};
  c.mbs = a.mb;
  for (int64_t x : c.mbs)
    if (x < 1) throw InputError(fmt::format("--mb {} must be at least 1", x));
  c.tps = a.tp;
  if (c.tps.empty())
    for (int64_t t = 1; t <= world->size(); ++t)
      if (world->size() % t == 0 && m.heads % t == 0 && m.kv_heads % t == 0 && m.intermediate % t == 0)
        c.tps.push_back(t);
  c.attention.clear();
  for (const auto& s : a.attention) c.attention.push_back(attention_parse(s));
  c.min_seconds = a.min_time;
  c.max_log2_bytes = a.max_log2_bytes;
  if (a.flush_mib < 0) throw InputError(fmt::format("--flush-mib {} must be 0 (from the caches) or positive", a.flush_mib));
  c.flush_bytes = a.flush_mib << 20;
  if (rank0) c.progress = [](const std::string& s) { fmt::print("calibrate: {}\n", s), std::fflush(stdout); };
  if (rank0)
    fmt::print("calibrate: {} on {} rank{} ({} per node, {} threads each), {} at T={}, tp {}, mb {}\n",
               device.name, world->size(), world->size() == 1 ? "" : "s", local_ranks_from_env(),
               a.threads > 0 ? fmt::format("{}", a.threads) : "the default", m.name, a.seq, fmt::join(c.tps, ","),
               fmt::join(c.mbs, ","));

  tuner::DeviceProfile p;
  p.device = device.name;
  p.origin = tuner::ProfileOrigin::measured;
  p.constants = tuner::datasheet_constants(device);
  p.fingerprint = tuner::machine_fingerprint(device, local_ranks_from_env(), a.threads);
  p.provenance = {{"command", "weft calibrate"}, {"model", m.name}, {"seq", a.seq}, {"world", world->size()},
                  {"tp", c.tps}, {"mb", c.mbs}, {"attention", a.attention}};
  auto rates = calibration::measure_device(c, device, *world, groups_for);
  if (!gpu) {
    const int64_t cores = device_preset("cpu").sm_count, ranks = local_ranks_from_env();
    const int64_t threads = a.threads > 0 ? a.threads : std::max<int64_t>(1, cores / ranks);
    rates.shared_cores = ranks * threads > cores;
  }
  p.rates = std::make_shared<const MeasuredRates>(std::move(rates));
  if (rank0) {
    tuner::profile_save(p, out);
    fmt::print("calibrate: {} GEMM shapes, {} attention calls, {} kernel families, {} collectives; wrote {}\n",
               p.rates->gemm.size(), p.rates->attention.size(), p.rates->streams.size(), p.rates->comm.size(), out);
  }
  world->barrier();
  return 0;
}

}  // namespace

Command add_calibrate_command(CLI::App& app) {
  auto a = std::make_shared<CalibrateArgs>();
  auto* sub = app.add_subcommand(
      "calibrate",
      "Device profiles for the cost model: measure this machine (under the mpirun and --threads of the training "
      "it will price), or fit the GPU presets to public measured runs (--public)");
  add_model_options(*sub, a->model);
  sub->add_option("--seq", a->seq, "Sequence length T of the shapes timed")->capture_default_str();
  sub->add_option("--tp", a->tp, "Tensor-parallel shards to time (default: every degree the world and model allow)")
      ->delimiter(',');
  sub->add_option("--mb", a->mb, "Micro-batch sizes to time")->delimiter(',')->capture_default_str();
  sub->add_option("--attn", a->attention, "Attention kinds to time")->delimiter(',')->capture_default_str();
  sub->add_option("--threads", a->threads, "CPU threads per rank, as training will use (0: an equal share)")
      ->capture_default_str();
  sub->add_option("--min-time", a->min_time, "Seconds each measurement runs at least")->capture_default_str();
  sub->add_option("--max-message-log2", a->max_log2_bytes, "Largest collective message, log2 bytes")
      ->capture_default_str();
  sub->add_option("--flush-mib", a->flush_mib,
                  "MiB of buffer copies each measurement cycles through, so that operands come from memory as in "
                  "training (0: from the cache sizes)")
      ->capture_default_str();
  sub->add_option("--device", a->device, "auto, cpu or gpu (default $WEFT_DEVICE, else auto)");
  sub->add_option("--out", a->out,
                  "The profile to write (default device-profile.json; with --public, the folder: "
                  "calibration/profiles)");
  sub->add_flag("--public", a->fit_public, "Fit the GPU presets' profiles to the public measured runs instead");
  sub->add_option("--csv", a->public_csv, "With --public: the runs (default: the project's calibration/public_runs.csv)");
  return {sub, [a] { return a->fit_public ? run_fit_public(*a) : run_measure(*a); }};
}

}  // namespace weft::cli
