// Unit tests for verbs/options: the verbs transport's SLIP_* variables.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <string_view>

#include "tests/unit/fake_env.h"
#include "verbs/options.h"

namespace slip::verbs {
namespace {

using testing_env::Env;
using testing_env::Lookup;

Options MustParse(Env env) {
  Options options;
  std::string error;
  EXPECT_TRUE(kOptionTable.Parse(Lookup, &env, &options, &error)) << error;
  return options;
}

// A bad value fails, names the variable and its value on one line, and leaves the output
// untouched.
void MustFail(const std::string& name, const std::string& value) {
  Env env{{name, value}};
  Options options;
  options.reuse = 777;  // sentinel
  std::string error;
  EXPECT_FALSE(kOptionTable.Parse(Lookup, &env, &options, &error)) << name << "=" << value;
  EXPECT_EQ(error.rfind(name + "=\"", 0), 0u) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_EQ(options.reuse, 777u);
}

TEST(VerbsOptions, Defaults) {
  Options o = MustParse({});
  EXPECT_TRUE(o.device.empty());
  EXPECT_EQ(o.gid_index, -1);
  EXPECT_EQ(o.notify, NotifyMode::kAuto);
  EXPECT_EQ(o.negative_ttl_ms, 10000u);
  EXPECT_EQ(o.reuse, 16u);
  EXPECT_EQ(o.pin_max, 0u);  // auto
}

TEST(VerbsOptions, Values) {
  Options o = MustParse({{"SLIP_DEVICE", "rxe0"},
                         {"SLIP_GID_INDEX", "1"},
                         {"SLIP_VERBS_NOTIFY", "SEND"},
                         {"SLIP_NEGATIVE_TTL_MS", "0"},
                         {"SLIP_VERBS_REUSE", "0"}});
  EXPECT_EQ(o.device, "rxe0");
  EXPECT_EQ(o.gid_index, 1);
  EXPECT_EQ(o.notify, NotifyMode::kSend);
  EXPECT_EQ(o.negative_ttl_ms, 0u);
  EXPECT_EQ(o.reuse, 0u);
  EXPECT_EQ(MustParse({{"SLIP_VERBS_REUSE", "1024"}}).reuse, 1024u);
  EXPECT_EQ(MustParse({{"SLIP_VERBS_NOTIFY", "imm"}}).notify, NotifyMode::kImm);
  EXPECT_EQ(MustParse({{"SLIP_VERBS_PIN_MAX", "512M"}}).pin_max, uint64_t(512) << 20);
  EXPECT_EQ(MustParse({{"SLIP_VERBS_PIN_MAX", "1024G"}}).pin_max, uint64_t(1) << 40);
}

TEST(VerbsOptions, BadValues) {
  MustFail("SLIP_VERBS_REUSE", "1025");
  MustFail("SLIP_VERBS_REUSE", "-1");
  MustFail("SLIP_VERBS_PIN_MAX", "0");
  MustFail("SLIP_VERBS_PIN_MAX", "1023K");
  MustFail("SLIP_VERBS_PIN_MAX", "1025G");
  MustFail("SLIP_VERBS_PIN_MAX", "lots");
  MustFail("SLIP_DEVICE", "");
  MustFail("SLIP_DEVICE", "rxe0;rm");
  MustFail("SLIP_DEVICE", std::string(64, 'a'));
  MustFail("SLIP_GID_INDEX", "256");
  MustFail("SLIP_GID_INDEX", "-1");
  MustFail("SLIP_VERBS_NOTIFY", "write");
  MustFail("SLIP_NEGATIVE_TTL_MS", "3600001");
}

TEST(VerbsOptions, NamesAreTheVariablesRead) {
  const auto names = kOptionTable.names();
  EXPECT_EQ(names.size(), 6u);
  for (const char* name : names) {
    // Each name listed is one the parser reads: a bad value there fails.
    Env env{{name, std::string(70, '\x01')}};
    Options o;
    EXPECT_FALSE(kOptionTable.Parse(Lookup, &env, &o, nullptr)) << name;
  }
  EXPECT_NE(std::find_if(names.begin(), names.end(),
                         [](const char* n) { return std::string_view(n) == "SLIP_VERBS_PIN_MAX"; }),
            names.end());
}

}  // namespace
}  // namespace slip::verbs
