// Public measured training runs (calibration/public_runs.csv, sources in
// calibration/SOURCES.md) as weft specs: each row's model, run, cluster and
// layout, what was measured, and the sweep it belongs to. The cost and memory
// models are fitted to and judged on these (calibration/fidelity.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/device_spec.h"
#include "core/layout.h"
#include "core/model_spec.h"
#include "core/run_spec.h"

namespace weft::calibration {

struct PublicRun {
  std::string source;  // the CSV's source tag
  std::string sweep;   // source, model, seq, device and device count: one model on one cluster
  int64_t line = 0;    // in the CSV, for messages
  ModelSpec model;
  RunSpec run;
  ClusterSpec cluster;
  Layout layout;
  bool oom = false;           // the source reports that it did not fit
  double measured_step_s = 0; // seconds per optimizer step (measured runs)
  // MFU of the measured step on weft's definition for `model` (so that the
  // prediction, made for the same spec, compares like with like).
  double measured_mfu = 0;
  bool held_out = false;      // in the held-out split (never fitted to)
  // The framework overlaps tensor-parallel collectives with the GEMMs
  // (SOURCES.md, "Attention and tensor-parallel overlap").
  bool tp_comm_overlapped = false;
};

struct PublicRunSet {
  std::vector<PublicRun> runs;
  std::map<std::string, int64_t> skipped;     // rows weft cannot express, by reason
  std::map<std::string, int64_t> skipped_cp;  // of those, the rows with context parallelism (cp > 1)
};

// Reads the CSV. A row becomes a PublicRun when weft can express it: a known
// device, a stated micro-batch and parallel degrees (cp with its framework's
// default transport, FP8 rows with their framework's recipe), and an attention kernel
// weft has (FlashAttention-2 class: flash; Megatron's fused softmax:
// materialized; Transformer Engine on Hopper: cudnn); other rows are counted
// in `skipped` by reason. Unstated
// values take the source's documented defaults (see SOURCES.md, "How weft
// reads the rows"). GPT-style models (a 4h GELU MLP) become the Llama of the
// same FLOPs: F = 8h/3. The held-out split is whole sweeps, 30% of each
// source's (its FP8 sweeps, whose names end in " fp8", apart), chosen by a
// hash of their names (never the file's order).
// InputError naming the path and line for a malformed file.
PublicRunSet public_runs_load(const std::string& path);

// Where the project's copy of the public runs is (WEFT_CALIBRATION_DIR at
// build time, overridable by $WEFT_CALIBRATION_DIR).
std::string calibration_dir();

}  // namespace weft::calibration
