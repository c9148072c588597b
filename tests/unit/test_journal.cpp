#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "test_util.h"
#include "tuner/journal.h"

namespace weft::tuner {
namespace {

using nlohmann::json;

json header() { return json{{"world", 8}, {"seq", 1024}, {"model", {{"hash", "9f2c"}, {"name", "tiny-test"}}}}; }

std::string header_line() {
  json h = header();
  h["kind"] = "header";
  return h.dump() + "\n";
}

std::string bytes_of(const std::string& path) {
  return test::file_contents(path);
}

TEST(Journal, RoundTripsAcrossReopen) {
  test::TempDir dir;
  const std::string path = dir.path("runs/x/tuning/journal.jsonl");  // folders do not exist yet
  const json a = {{"layout", "tp2-pp1-dp4-mb1"}, {"step_s", 0.4123456789012345}, {"mfu", 0.51}};
  const json b = {{"layout", "tp1-pp2-dp4-mb2"}, {"status", "oom"}, {"peak_bytes", int64_t(80) << 30}};
  {
    auto j = Journal::open(path, header());
    EXPECT_EQ(j.path(), path);
    EXPECT_TRUE(j.results().empty());
    j.start("tp2-pp1-dp4-mb1");
    j.finish(a);
    j.start("tp1-pp2-dp4-mb2");
    j.finish(b);
    EXPECT_TRUE(j.unfinished().empty());
  }
  // The first line is the header with its kind.
  const std::string text = bytes_of(path);
  EXPECT_EQ(text.substr(0, text.find('\n') + 1), header_line());

  auto j = Journal::open(path, header());
  ASSERT_EQ(j.results().size(), 2u);
  EXPECT_EQ(j.results()[0], a);
  EXPECT_EQ(j.results()[1], b);
  ASSERT_NE(j.result("tp2-pp1-dp4-mb1"), nullptr);
  EXPECT_EQ(j.result("tp2-pp1-dp4-mb1")->at("step_s").get<double>(), 0.4123456789012345);
  EXPECT_EQ(*j.result("tp1-pp2-dp4-mb2"), b);
  EXPECT_EQ(j.result("tp4-pp1-dp2-mb1"), nullptr);
  EXPECT_TRUE(j.unfinished().empty());

  // Appending after a reopen continues the same file.
  const json c = {{"layout", "tp4-pp1-dp2-mb1"}, {"step_s", 0.5}};
  j.start("tp4-pp1-dp2-mb1");
  j.finish(c);
  auto again = Journal::open(path, header());
  ASSERT_EQ(again.results().size(), 3u);
  EXPECT_EQ(again.results()[2], c);
}

TEST(Journal, StartWithoutFinishIsUnfinished) {
  test::TempDir dir;
  const std::string path = dir.path("journal.jsonl");
  {
    auto j = Journal::open(path, header());
    j.start("tp1-pp1-dp8-mb1");
    j.finish({{"layout", "tp1-pp1-dp8-mb1"}, {"step_s", 1.0}});
    j.start("tp8-pp1-dp1-mb1");
    EXPECT_EQ(j.unfinished(), std::vector<std::string>{"tp8-pp1-dp1-mb1"});
    // The process dies here: the journal is dropped without a result.
  }
  {
    auto j = Journal::open(path, header());
    EXPECT_EQ(j.unfinished(), std::vector<std::string>{"tp8-pp1-dp1-mb1"});
    EXPECT_EQ(j.result("tp8-pp1-dp1-mb1"), nullptr);
    EXPECT_EQ(j.results().size(), 1u);
    // Started again and finished this time (say, with a skip recorded as its result).
    j.start("tp8-pp1-dp1-mb1");
    j.finish({{"layout", "tp8-pp1-dp1-mb1"}, {"status", "skipped"}});
    EXPECT_TRUE(j.unfinished().empty());
  }
  auto j = Journal::open(path, header());
  EXPECT_TRUE(j.unfinished().empty());
  EXPECT_EQ(j.result("tp8-pp1-dp1-mb1")->at("status"), "skipped");
}

TEST(Journal, HeaderMismatchNamesEveryKeyWithBothValues) {
  test::TempDir dir;
  const std::string path = dir.path("runs/x/tuning/journal.jsonl");
  {
    auto j = Journal::open(path, header());
    j.start("tp2-pp1-dp4-mb1");
  }
  const std::string before = bytes_of(path);
  json ours = header();
  ours["world"] = 4;
  ours["model"]["hash"] = "77aa";
  ours["precision"] = "bf16";
  try {
    (void)Journal::open(path, ours);
    ADD_FAILURE() << "expected InputError";
  } catch (const FileFormatError& e) {
    ADD_FAILURE() << "a header mismatch is not a format error: " << e.what();
  } catch (const InputError& e) {
    const std::string msg = e.what();
    for (const char* frag : {"journal", "world 8, this run has 4", "model.hash 9f2c, this run has 77aa",
                             "precision (absent), this run has bf16"})
      EXPECT_NE(msg.find(frag), std::string::npos) << "'" << msg << "' lacks '" << frag << "'";
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_EQ(msg.find("seq"), std::string::npos) << "equal keys are not listed: " << msg;
  }
  EXPECT_EQ(bytes_of(path), before);
}

TEST(Journal, MalformedLinesNameTheFileAndLine) {
  const std::string start = R"({"kind":"start","layout":"tp2-pp1-dp4-mb1"})"
                            "\n";
  struct Case {
    std::string content;
    const char* line;
    const char* why;
  };
  const std::vector<Case> cases = {
      {header_line() + "not json\n", "line 2", "not JSON"},
      {header_line() + "\n", "line 2", "not JSON"},
      {header_line() + start + R"({"layout":"a"})" "\n", "line 3", "no \"kind\""},
      {header_line() + "[1,2]\n", "line 2", "no \"kind\""},
      {header_line() + start + R"({"kind":"restart"})" "\n", "line 3", "unknown kind \"restart\""},
      {header_line() + R"({"kind":"start"})" "\n", "line 2", "layout"},
      {header_line() + R"({"kind":"result","result":{"step_s":1}})" "\n", "line 2", "layout"},
      {header_line() + header_line(), "line 2", "second header"},
      {start + header_line(), "line 1", "header"},
      // The process died while writing the last line.
      {header_line() + start + R"({"kind":"result","result":{"lay)", "line 3", "cut off"},
      {header_line() + start.substr(0, start.size() - 1), "line 2", "cut off"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.content);
    test::TempDir dir;
    const std::string path = dir.file("journal.jsonl", c.content);
    WEFT_EXPECT_THROW_MSG((void)Journal::open(path, header()), FileFormatError, "journal", path.c_str(),
                          c.line, c.why);
    EXPECT_EQ(bytes_of(path), c.content);
  }
}

TEST(Journal, TornFinalLineOfARealJournalIsReportedAndKept) {
  test::TempDir dir;
  const std::string path = dir.path("journal.jsonl");
  {
    auto j = Journal::open(path, header());
    j.start("tp2-pp1-dp4-mb1");
    j.finish({{"layout", "tp2-pp1-dp4-mb1"}, {"step_s", 0.4}});
  }
  { std::ofstream(path, std::ios::app | std::ios::binary) << R"({"kind":"sta)"; }
  const std::string before = bytes_of(path);
  WEFT_EXPECT_THROW_MSG((void)Journal::open(path, header()), FileFormatError, path.c_str(), "line 4", "cut off");
  EXPECT_EQ(bytes_of(path), before);
}

TEST(Journal, EmptyFileGetsAHeader) {
  test::TempDir dir;
  const std::string path = dir.file("journal.jsonl", "");
  auto j = Journal::open(path, header());
  j.start("tp1-pp1-dp8-mb1");
  EXPECT_EQ(bytes_of(path), header_line() + R"({"kind":"start","layout":"tp1-pp1-dp8-mb1"})" "\n");
}

}  // namespace
}  // namespace weft::tuner
