// The training loop of one rank: data, the 1F1B pipeline schedule over the
// micro-batches of each step, tensor- and data-parallel reductions, the
// optimizer, logging and metrics (world rank 0), validation, checkpoints
// (periodic, final, and on a stop request such as SIGINT) and exact resume.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/device_spec.h"
#include "core/layout.h"
#include "memory/shapes.h"
#include "trainer/optim/optimizer.h"
#include "trainer/parallel/comm_watchdog.h"
#include "trainer/parallel/process_groups.h"

namespace weft::trainer {

// Receives every record the run writes to metrics.jsonl, in the same order,
// on the rank that writes them (world rank 0): a second place for the same
// numbers (report/tensorboard.h writes TensorBoard event files). launch() is
// called once per launch before its first record, with the step a resumed
// launch continues after (0 for a fresh run): records of later steps from
// earlier launches are superseded from then on, as in metrics.jsonl.
class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  virtual void launch(int64_t resumed_after) = 0;
  virtual void record(const nlohmann::json& r) = 0;
};

struct TrainConfig {
  ModelSpec model;
  // Where the architecture came from, for the run header: a preset's name,
  // or a Hugging Face config.json (architecture only: its weights load with
  // `init`). Empty: not said.
  std::string model_from;
  RunSpec run;
  Layout layout;
  DeviceSpec device;
  OptimConfig optim;
  int64_t steps = 1000;
  uint64_t seed = 1234;
  std::vector<std::string> data;  // --data's items (data_spec.h); empty: the default corpus
  bool data_checked = false;    // the caller ran token_data_validate on it already
  int64_t log_every = 10;
  int64_t eval_every = 100;     // 0: only at the end
  int64_t eval_samples = 64;    // validation sequences per evaluation
  std::string out_dir = "runs/default";  // metrics.jsonl, and checkpoints/ by default
  std::string ckpt_dir;         // empty: <out_dir>/checkpoints
  int64_t ckpt_every = 0;       // 0: only at the end and on a stop request
  bool checkpoints = true;      // false: none at all (benchmarks, throwaway runs)
  // Periodic checkpoints are written by a thread while training goes on
  // (trainer/async_save.h); false: each save stalls training until written.
  bool async_checkpoints = true;
  bool resume = false;          // continue from the newest checkpoint in ckpt_dir
  std::string resume_from;      // or from this checkpoint folder
  // Settings a resume may change from the checkpoint's (--change lr,warmup;
  // trainer/resume_check.h): without them a different value is refused.
  std::vector<std::string> changes;
  // Start from these pretrained weights (a Hugging Face model folder or a
  // weft checkpoint; checkpoint/pretrained.h) at step 0 with a fresh optimizer
  // and data position. With `resume`, only when ckpt_dir has no checkpoint
  // yet, so a relaunched job continues instead of starting over. steps may
  // then be 0: the loaded model is written as a step-0 checkpoint.
  std::string init;
  // LoRA (run.lora): start the adapters from this PEFT adapter folder
  // (checkpoint/peft.h) instead of from the seed. Empty: the seed.
  std::string lora_init;
  int64_t threads = 0;          // 0: every core
  const std::atomic<bool>* stop = nullptr;  // set asynchronously: checkpoint and return
  // The rank's process groups (MPI); null: a single process.
  parallel::ProcessGroups* groups = nullptr;
  // The communicator that carries a multi-rank GPU run's tensors ("nccl" or
  // "mpi", parallel::device_comm_choose) and why, for the run header; empty:
  // none (one rank) or host memory (the CPU).
  std::string comm;
  std::string comm_why;
  // Watches those groups; also measures the time spent communicating. Long
  // stretches without communication (the weights' initialisation) tell it
  // they are progress.
  parallel::CommWatchdog* watchdog = nullptr;
  // Called after every step with (step, steps): a progress bar. May be empty.
  std::function<void(int64_t, int64_t)> on_step;
  // Also gets every metrics.jsonl record (world rank 0). May be null.
  std::shared_ptr<MetricsSink> metrics_sink;
};

struct TrainReport {
  int64_t first_step = 0;  // 1-based step the run started at (after a resume)
  int64_t last_step = 0;   // last completed step
  std::vector<double> losses;  // mean training loss of each step run
  double val_loss = 0;         // at the end; NaN without a validation split
  double baseline = 0;         // unigram entropy of the training data, nats/token
  double tokens_per_second = 0;
  bool interrupted = false;
  // Why the run stopped short of --steps other than a signal (an MoE batch
  // routed past the receive buffers: its step, or the validation after a
  // step, and the text), after the checkpoint of the last completed step;
  // empty: it did not.
  std::string error;
  std::string checkpoint;      // the last checkpoint written
  std::array<int64_t, memory::kCategories> measured{};   // arena peaks
  std::array<int64_t, memory::kCategories> predicted{};  // memory model
  // Measured apart from the arena: on the CPU the growth of the process's
  // resident high-water mark over the run (memory/host_usage.h), on a GPU
  // this run's device memory as the driver counts it (independent_what). 0:
  // none.
  int64_t independent = 0;
  // What measured it on a GPU (NVML's count of the process, or the
  // driver's used memory since the run began).
  std::string independent_what;
  // On the CPU, the same growth while a checkpoint was written (the save's
  // whole-tensor copies, outside the memory model); 0: no save measured.
  int64_t independent_save = 0;
  double seconds = 0;          // wall time of the training steps
  bool nothing_to_do = false;  // resumed at or past --steps
};

// Where check_trainable asks: `here`, this process's build and device (a
// run, a tuning); `anywhere`, the trainer's code alone, for a device of the
// kind named (a dry-run for a cluster this machine is not).
enum class Trainable { here, anywhere };

// LayoutError when the trainer cannot run a valid layout yet (context
// parallelism's ring or all-gather on a GPU with the materialized attention;
// grad:bf16 on a CPU, which trains in fp32; attn:cudnn on a CPU), or, asked `here`,
// not in this build or on this process's device (attn:cudnn in a build
// without the cuDNN frontend; FP8 GEMMs when the CUDA device lacks FP8
// tensor cores, below compute capability 8.9, or the build lacks CUDA).
void check_trainable(const Layout& l, DeviceKind device = DeviceKind::gpu, Trainable where = Trainable::here);
// The same for a model (an MoE model's own limits are require_moe_layout's),
// and given the sequence length (`seq` > 0) what depends on it: cuDNN's
// chunks under cp's ring and all-gather (cudnn_chunk_problem).
void check_trainable(const ModelSpec& m, const Layout& l, DeviceKind device, Trainable where, int64_t seq = 0);
// Why cuDNN's attention cannot take the chunks a layout cuts sequences of
// `seq` positions into on a GPU (each a multiple of 4 positions, its lse on
// 16 bytes), or "" where it can or does not run.
std::string cudnn_chunk_problem(const Layout& l, int64_t seq);

// InputError naming the value for settings train() cannot run with, apart
// from the layout (steps, intervals, threads, precision against the device,
// --init against --resume-from, the model, run and optimizer specs).
void validate_config(const TrainConfig& c);

// OpenMP and BLAS threads of this process (0: every core).
void set_threads(int64_t threads);

// Trains, printing progress to `log` and appending metrics to
// <out_dir>/metrics.jsonl. Throws InputError for bad configuration or data,
// NonFiniteError when too many steps in a row are non-finite.
TrainReport train(const TrainConfig& config, std::FILE* log);

}  // namespace weft::trainer
