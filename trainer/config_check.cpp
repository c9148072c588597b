// What a run may be, checked before anything is built: the configuration's
// values (validate_config) and whether the trainer runs a valid layout
// here or anywhere (check_trainable).
#include <algorithm>

#include <fmt/format.h>

#include "kernels/attention/attention.h"
#include "kernels/fp8/fp8_ops.h"
#include "trainer/loop.h"
#include "trainer/resume_check.h"

namespace weft::trainer {

std::string cudnn_chunk_problem(const Layout& l, int64_t seq) {
  if (l.attention != AttentionKind::cudnn || l.cp <= 1 || l.cp_comm == CpComm::a2a || (seq / (2 * l.cp)) % 4 == 0)
    return {};
  return fmt::format("--seq {} under cp{} over cp:{} with attn:cudnn splits each sequence into chunks of {} "
                     "positions, and cuDNN takes chunks of a multiple of 4 (--seq a multiple of {}); use attn:flash, "
                     "cp:a2a, or such a --seq",
                     seq, l.cp, to_string(l.cp_comm), seq / (2 * l.cp), 8 * l.cp);
}

void check_trainable(const ModelSpec& m, const Layout& l, DeviceKind device, Trainable where, int64_t seq) {
  check_trainable(l, device, where);
  if (device == DeviceKind::gpu && seq > 0)
    if (const std::string why = cudnn_chunk_problem(l, seq); !why.empty())
      throw LayoutError(fmt::format("layout {}: {}", l.to_string(), why));
  // An MoE model trains on either device; its FP8 blocks on the CPU only
  // (what else its blocks do not compute yet, require_moe_layout names).
  if (m.moe.enabled() && l.fp8 != Fp8Recipe::off && device == DeviceKind::gpu)
    throw LayoutError(fmt::format("layout {}: FP8 GEMMs in {}'s MoE blocks are computed by the CPU trainer only yet, "
                                  "not on a GPU (use fp8:off)",
                                  l.to_string(), m.name));
}

void check_trainable(const Layout& l, DeviceKind device, Trainable where) {
  const bool gpu = device == DeviceKind::gpu;
  const bool here = where == Trainable::here;
  if (l.grad == GradPrecision::bf16 && !gpu)
    throw LayoutError(fmt::format("layout {}: grad:bf16 needs the GPU trainer; the CPU trainer computes and "
                                  "accumulates in fp32 (use grad:fp32)",
                                  l.to_string()));
  if (l.attention == AttentionKind::cudnn && (here || !gpu) &&
      !kernels::attention_available(l.attention, gpu ? kernels::Backend::cuda : kernels::Backend::cpu))
    throw LayoutError(fmt::format(
        "layout {}: attention cudnn runs cuDNN's fused attention, {}; attn:flash and attn:materialized run "
        "everywhere",
        l.to_string(),
        gpu ? "which this build lacks (install nvidia-cudnn-frontend, e.g. with tools/setup.sh, and "
              "reconfigure: CMake prints a line for the cuDNN frontend)"
            : "which needs a GPU"));
  // Context parallelism's ring and all-gather call attention on blocks of
  // the sequence, which the CUDA backend computes with flash and cudnn (its
  // blocks are the kinds cuDNN's masks take: kernels/attention/
  // attention_cudnn.h); all-to-all calls it on the whole sequence of H / cp
  // heads, as without cp, which every kind takes.
  if (l.cp > 1 && gpu && l.attention == AttentionKind::materialized && l.cp_comm != CpComm::a2a)
    throw LayoutError(fmt::format("layout {}: context parallelism (cp={}) over cp:{} on a GPU needs attn:flash or "
                                  "attn:cudnn: the CUDA materialized attention takes no blocks of the sequence (use "
                                  "attn:flash, attn:cudnn, cp:a2a, or cp1)",
                                  l.to_string(), l.cp, to_string(l.cp_comm)));
  if (l.fp8 != Fp8Recipe::off && gpu && here) {
    std::string here;
    if (!kernels::fp8_gemm_available(kernels::Backend::cuda, &here))
      throw LayoutError(fmt::format("layout {}: FP8 GEMMs ({}) need a GPU with FP8 tensor cores (compute capability "
                                    "8.9 or newer: L4, L40, H100, H200, B200) and a CUDA build; here: {} (use "
                                    "fp8:off on this GPU, or the CPU trainer's emulated FP8)",
                                    l.to_string(), gemm_precision_text(l), here));
  }
}

void validate_config(const TrainConfig& c) {
  c.model.validate();
  c.model.require_computed("train");
  c.run.validate();
  c.optim.validate();
  if (c.steps < 1 && !(c.steps == 0 && !c.init.empty()))
    throw InputError(fmt::format("--steps {} must be at least 1 (0 only with --init: it writes the loaded "
                                 "model as a step-0 checkpoint)",
                                 c.steps));
  if (!c.changes.empty() && !c.resume && c.resume_from.empty())
    throw InputError(fmt::format("--change {} applies to a resumed run (--resume or --resume-from): a new run "
                                 "takes every setting from its command",
                                 fmt::join(c.changes, ",")));
  for (const auto& name : c.changes)
    if (std::find(changeable_settings().begin(), changeable_settings().end(), name) == changeable_settings().end())
      throw InputError(fmt::format("--change {}: '{}' is not a setting a resume may change; use any of {}",
                                   fmt::join(c.changes, ","), name, fmt::join(changeable_settings(), ", ")));
  if (!c.init.empty() && !c.resume_from.empty())
    throw InputError(fmt::format("--init {} starts a new run from pretrained weights and --resume-from {} "
                                 "continues one; give one of them (--init with --resume continues the run "
                                 "when it has a checkpoint and starts from --init when it has none)",
                                 c.init, c.resume_from));
  const bool gpu = c.device.kind == DeviceKind::gpu;
  if (!gpu && c.run.precision != Precision::fp32)
    throw InputError(fmt::format("precision {}: the CPU trainer runs in fp32; pass --precision fp32 "
                                 "(bf16 needs a GPU)", to_string(c.run.precision)));
  if (gpu && c.run.precision != Precision::bf16)
    throw InputError(fmt::format("precision {}: the GPU trainer runs in bf16 with fp32 master weights; "
                                 "pass --precision bf16, or --device cpu for fp32",
                                 to_string(c.run.precision)));
  // The CUDA attention kinds mask by position only (kernels/attention/
  // attention.h): attention within chunks runs on the CPU.
  const int64_t chunk = c.model.attention.attention_chunk;
  if (gpu && chunk > 0 && c.run.seq > chunk)
    throw InputError(fmt::format("--seq {} is past {}'s attention chunk of {} positions: the GPU's attention kernels "
                                 "do not attend within chunks yet; train with --device cpu (flash or materialized "
                                 "attention), or with --seq {} or less",
                                 c.run.seq, c.model.name, chunk, chunk));
  // cuDNN reads each chunk's lse from a 16-byte boundary: under the ring and
  // the all-gather a chunk is T / (2 cp) rows of 4 bytes, so a multiple of 4.
  if (gpu)
    if (const std::string why = cudnn_chunk_problem(c.layout, c.run.seq); !why.empty()) throw InputError(why);
  if (c.log_every < 1) throw InputError(fmt::format("--log-every {} must be at least 1", c.log_every));
  if (c.eval_every < 0)
    throw InputError(fmt::format("--eval-every {} is not valid; use 0 (at the end only) or a number of steps",
                                 c.eval_every));
  if (c.eval_samples < 1) throw InputError(fmt::format("--eval-samples {} must be at least 1", c.eval_samples));
  if (c.ckpt_every < 0)
    throw InputError(fmt::format("--ckpt-every {} is not valid; use 0 (at the end only) or a number of steps",
                                 c.ckpt_every));
  if (c.threads < 0)
    throw InputError(fmt::format("--threads {} is not valid; use 0 (every core) or a number of threads", c.threads));
}

}  // namespace weft::trainer
