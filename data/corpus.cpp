#include "data/corpus.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_io.h"
#include "data/prepare.h"

namespace weft::data {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A corpus folder is usable when its meta.json says it is a complete weft
// dataset of the current format; anything else is rebuilt.
bool corpus_ready(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir / "meta.json", ec)) return false;
  try {
    const auto meta = json_read_file((dir / "meta.json").string(), "corpus description");
    return meta.value("format", "") == "weft-data" && meta.value("version", 0) == 1 &&
           fs::exists(dir / "train.tok") && fs::exists(dir / "val.tok");
  } catch (const InputError&) {
    return false;
  } catch (const nlohmann::json::type_error&) {  // a field of another type: not ours either
    return false;
  }
}

std::atomic<int> staging_counter{0};

}  // namespace

std::vector<std::string> fortune_files(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    const std::string name = p.filename().string();
    if (it->is_symlink(ec) || !it->is_regular_file(ec)) continue;
    if (name.empty() || name[0] == '.' || ends_with(name, ".dat") || ends_with(name, ".u8"))
      continue;
    files.push_back(p.string());
  }
  if (files.empty())
    throw InputError(fmt::format(
        "the default corpus needs the text of Debian's fortunes package, but '{}' holds no "
        "fortune files; install it with `apt-get install fortunes` or pass your own data",
        dir));
  std::sort(files.begin(), files.end());
  return files;
}

std::string data_cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return (fs::path(xdg) / "weft" / "data").string();
  if (const char* home = std::getenv("HOME"); home && *home)
    return (fs::path(home) / ".cache" / "weft" / "data").string();
  throw InputError("cannot place the data cache: set XDG_CACHE_HOME or HOME");
}

std::string default_corpus_dir(const std::string& source_dir, const std::string& cache_dir) {
  const fs::path target = fs::path(cache_dir) / "fortunes";
  if (corpus_ready(target)) return target.string();

  PrepareOptions o;
  o.inputs = fortune_files(source_dir);
  // A private folder of our own: concurrent runs each prepare their own copy,
  // so none of them can see another's half-written files.
  const fs::path staging =
      fs::path(cache_dir) / fmt::format(".fortunes.staging-{}-{}", ::getpid(), staging_counter++);
  o.out = staging.string();
  std::error_code ec;
  fs::create_directories(cache_dir, ec);
  if (ec)
    throw InputError(fmt::format("cannot create the data cache '{}': {}", cache_dir, ec.message()));
  try {
    data_prepare(o);
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
  // A leftover that is not a usable corpus (interrupted by hand, an older
  // format) is moved aside first; rename(2) cannot replace a non-empty folder.
  if (fs::exists(target, ec) && !corpus_ready(target)) {
    const fs::path stale = fs::path(cache_dir) / fmt::format(".fortunes.stale-{}", ::getpid());
    fs::rename(target, stale, ec);
    fs::remove_all(stale, ec);
  }
  fs::rename(staging, target, ec);
  if (ec) {
    // Another run finished first; its corpus is the same bytes.
    fs::remove_all(staging, ec);
    if (!corpus_ready(target))
      throw InputError(fmt::format("cannot move the prepared corpus into '{}'", target.string()));
  }
  return target.string();
}

DataSpec data_spec_or_corpus(const std::vector<std::string>& items) {
  DataSpec spec = data_spec_parse(items);
  if (spec.paths.empty()) spec.paths = {default_corpus_dir()};
  return spec;
}

}  // namespace weft::data
