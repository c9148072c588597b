// `weft recipe sbatch`: a Slurm batch script that trains a recipe (or tunes
// in the allocation first) and survives failures.
//
// The script starts the ranks with mpirun inside the allocation (Open MPI's
// Slurm support reads the nodes and tasks from it; no hostfile, no ssh) and
// runs `weft train --resume`, which continues from the run folder's last
// complete checkpoint or starts fresh when it has none. When a launch fails
// in a way another launch can fix (a rank or node lost: mpirun's code for the
// rank, 124 from weft's communication watchdog, 137 for a SIGKILL; a stop by
// SIGTERM, 143, e.g. at the time limit, which Slurm sends two minutes ahead so
// that weft checkpoints) the script requeues its own job, at most
// --max-restarts times (Slurm's SLURM_RESTART_COUNT counts them); bad input
// (exit 2) is not retried. `#SBATCH --requeue` also lets Slurm requeue the job
// itself when a node fails.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft::cli {

struct SbatchSpec {
  std::string weft;           // the weft binary the nodes run (absolute)
  std::string run_dir;        // the run folder (absolute)
  std::string recipe;         // a recipe file (absolute); empty: tune in the allocation (--auto)
  std::string job_name;
  int64_t nodes = 1;
  int64_t tasks_per_node = 1;
  std::string time;           // --time; empty: the partition's default
  std::string partition;      // empty: the default partition
  std::string account;        // empty: none
  int64_t max_restarts = 3;
  std::vector<std::string> train_words;  // the rest of `weft train`'s arguments (quoted in the script)
  std::string summary;        // one line on what the job trains, for the script's header
};

std::string sbatch_script(const SbatchSpec& s);

// `text` split into words as a POSIX shell splits them (blanks between words;
// '...' literal; "..." with \\ \" \$ \` escapes; \ outside quotes escapes the
// next character); InputError naming `option` for an unbalanced quote or a
// trailing backslash. Expansions ($, `, globs) are taken literally: the
// words are quoted again in the script.
std::vector<std::string> shell_words(const std::string& text, const std::string& option);

// Whether `t` is a time limit sbatch takes: minutes, minutes:seconds,
// hours:minutes:seconds, days-hours, days-hours:minutes,
// days-hours:minutes:seconds, or unlimited.
bool slurm_time_valid(const std::string& t);

// A word as the script writes it: single-quoted.
std::string shell_quote(const std::string& word);

}  // namespace weft::cli
