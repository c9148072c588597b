#include "cli/sbatch.h"

#include <regex>
#include <string_view>

#include <fmt/format.h>

#include "core/error.h"

namespace weft::cli {

bool slurm_time_valid(const std::string& t) {
  static const std::regex re(
      R"(^(\d{1,9}|\d{1,9}:\d{1,2}|\d{1,9}:\d{1,2}:\d{1,2}|\d{1,9}-\d{1,9}|\d{1,9}-\d{1,9}:\d{1,2}|\d{1,9}-\d{1,9}:\d{1,2}:\d{1,2}|UNLIMITED|unlimited|INFINITE|infinite)$)");
  return std::regex_match(t, re);
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::vector<std::string> shell_words(const std::string& text, const std::string& option) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\'') {
      const size_t end = text.find('\'', i + 1);
      if (end == std::string::npos)
        throw InputError(fmt::format("{} has an unbalanced ' (from character {}): close the quote", option, i + 1));
      word += text.substr(i + 1, end - i - 1);
      i = end;
    } else if (c == '"') {
      size_t j = i + 1;
      for (; j < text.size() && text[j] != '"'; ++j) {
        if (text[j] == '\\' && j + 1 < text.size() && std::string_view("\\\"$`").find(text[j + 1]) != std::string_view::npos)
          ++j;
        word += text[j];
      }
      if (j >= text.size())
        throw InputError(fmt::format("{} has an unbalanced \" (from character {}): close the quote", option, i + 1));
      i = j;
    } else if (c == '\\') {
      if (i + 1 >= text.size())
        throw InputError(fmt::format("{} ends in a backslash: escape a character or drop it", option));
      word += text[++i];
    } else {
      word += c;
    }
  }
  if (in_word) words.push_back(std::move(word));
  return words;
}

std::string sbatch_script(const SbatchSpec& s) {
  std::string train;
  for (const std::string& w : s.train_words) train += (train.empty() ? "" : " ") + shell_quote(w);
  std::string o = "#!/bin/bash\n";
  std::string summary = s.summary;  // one comment line, whatever the words hold
  for (char& c : summary)
    if (c == '\n' || c == '\r') c = ' ';
  o += fmt::format("# Written by `weft recipe sbatch`: {}\n", summary);
  o += "# Submit with: sbatch THIS_FILE. Each launch continues from the run folder's last\n"
       "# complete checkpoint; a launch that fails for a reason another launch can fix\n"
       "# requeues the job (see the end of this file).\n";
  o += fmt::format("#SBATCH --job-name={}\n", s.job_name);
  o += fmt::format("#SBATCH --nodes={}\n", s.nodes);
  o += fmt::format("#SBATCH --ntasks-per-node={}\n", s.tasks_per_node);
  o += "#SBATCH --requeue\n";
  o += "#SBATCH --open-mode=append\n";
  o += fmt::format("#SBATCH --output={}/slurm-%j.out\n", s.run_dir);
  // SIGTERM to this script two minutes before the time limit: weft saves a
  // checkpoint at the end of the step in progress and exits 143.
  o += "#SBATCH --signal=B:TERM@120\n";
  if (!s.time.empty()) o += fmt::format("#SBATCH --time={}\n", s.time);
  if (!s.partition.empty()) o += fmt::format("#SBATCH --partition={}\n", s.partition);
  if (!s.account.empty()) o += fmt::format("#SBATCH --account={}\n", s.account);
  o += "\nset -u\n";
  o += fmt::format("weft={}\nrun={}\nmax_restarts={}\n", shell_quote(s.weft), shell_quote(s.run_dir), s.max_restarts);
  o += "restarts=${SLURM_RESTART_COUNT:-0}\n";
  o += "mkdir -p \"$run\"\n";
  o += R"SH(
# NCCL: report problems and let a hung collective fail rather than wait
# forever (weft's own watchdog, --comm-timeout, ends the ranks too). Site
# settings (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, ...) go in the environment
# sbatch is called from, which the job inherits.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# Open MPI reads the nodes and tasks of the allocation (its Slurm support):
# one rank per task, no hostfile. Ranks are not bound to cores: weft sets its
# own thread counts.
launch=(mpirun --bind-to none)
)SH";
  if (s.recipe.empty()) {
    o += "# The first launch tunes in the allocation (--auto) and writes recipe.json\n"
         "# into the run folder; later launches train that recipe.\n";
    o += "if [ -f \"$run/recipe.json\" ]; then layout=(--recipe \"$run/recipe.json\"); else layout=(--auto); fi\n";
  } else {
    o += fmt::format("layout=(--recipe {})\n", shell_quote(s.recipe));
  }
  o += fmt::format(R"SH(
echo "weft: job ${{SLURM_JOB_ID:-?}} launch $((restarts + 1)) on ${{SLURM_JOB_NODELIST:-?}} ($(date -u +%FT%TZ))"
"${{launch[@]}}" "$weft" train "${{layout[@]}}" --resume --out "$run" {} &
pid=$!
# Forward the time limit's SIGTERM to mpirun, which passes it to the ranks.
trap 'kill -TERM $pid 2>/dev/null' TERM
rc=0
wait $pid || rc=$?
while kill -0 $pid 2>/dev/null; do rc=0; wait $pid || rc=$?; done

case $rc in
  0) echo "weft: finished"; exit 0 ;;
  2) echo "weft: the run was refused (exit 2: bad input); not requeued"; exit 2 ;;
esac
# Anything else (a rank or node lost, the watchdog's 124, a SIGTERM's 143)
# can be fixed by another launch from the last checkpoint.
if [ "$restarts" -lt "$max_restarts" ] && [ -n "${{SLURM_JOB_ID:-}}" ]; then
  echo "weft: launch failed (exit $rc); requeueing (restart $((restarts + 1)) of $max_restarts)"
  scontrol requeue "$SLURM_JOB_ID"
else
  echo "weft: launch failed (exit $rc); not requeued ($restarts restarts of at most $max_restarts)"
fi
exit $rc
)SH",
                   train);
  return o;
}

}  // namespace weft::cli
