// JSON io: a value of the wrong type is named by its field's path.
#include <functional>

#include <nlohmann/json.hpp>

#include "core/json_io.h"
#include "test_util.h"

namespace weft {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const nlohmann::json::exception& e) {
    return json_error_text(e);
  }
  return "(no error)";
}

TEST(JsonIo, TypeErrorsNameTheFieldPath) {
  const auto j = nlohmann::json::parse(R"({"cluster": {"device": {"name": 3}}, "trials": [{}, {"step_s": null}]})");
  EXPECT_EQ(error_of([&] { (void)j.at("cluster").at("device").at("name").get<std::string>(); }),
            "field 'cluster.device.name': type must be string, but is number");
  EXPECT_EQ(error_of([&] { (void)j.at("trials").at(1).value("step_s", 0.0); }),
            "field 'trials[1].step_s': type must be number, but is null");
  // A copy of a part keeps the path from that part down.
  const nlohmann::json cluster = j.at("cluster");
  EXPECT_EQ(error_of([&] { (void)cluster.at("device").at("name").get<std::string>(); }),
            "field 'device.name': type must be string, but is number");
  const std::string missing = error_of([&] { (void)j.at("cluster").at("gpus"); });
  EXPECT_EQ(missing.find("[json.exception"), std::string::npos) << missing;
  EXPECT_NE(missing.find("'gpus'"), std::string::npos) << missing;
  EXPECT_EQ(json_field_path("/a~1b/0/c~0d"), "a/b[0].c~d");
  EXPECT_EQ(json_field_path(""), "");
}

}  // namespace
}  // namespace weft
