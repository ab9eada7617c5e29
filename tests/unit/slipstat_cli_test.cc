// Unit tests for slip-stat's command line (tools/slip-stat/cli.h). Suites are lower case so
// that `ctest -R slipstat` selects them.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "core/stats.h"
#include "tools/slip-stat/cli.h"

namespace slipstat {
namespace {

Options Parse(std::initializer_list<const char*> args) {
  std::vector<char*> argv = {const_cast<char*>("slip-stat")};
  for (const char* a : args) argv.push_back(const_cast<char*>(a));
  argv.push_back(nullptr);
  return ParseCommandLine(static_cast<int>(argv.size() - 1), argv.data());
}

std::string ErrorOf(std::initializer_list<const char*> args) {
  try {
    Parse(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(slipstat_cli, Defaults) {
  Options o = Parse({});
  EXPECT_FALSE(o.help || o.json || o.reasons || o.view.all || o.view.human || o.scan.clean);
  EXPECT_EQ(o.watch_s, 0);
  EXPECT_TRUE(o.scan.pids.empty());
  EXPECT_EQ(o.scan.dir, kStatsDir);
}

TEST(slipstat_cli, Flags) {
  Options o = Parse({"-a", "--human", "-j", "--clean"});
  EXPECT_TRUE(o.view.all && o.view.human && o.json && o.scan.clean);
  EXPECT_TRUE(Parse({"--reasons"}).reasons);
  EXPECT_TRUE(Parse({"-h"}).help);
}

TEST(slipstat_cli, Pids) {
  EXPECT_EQ(Parse({"-p", "12", "-p34", "--pid=5,6", "--pid", "7"}).scan.pids,
            (std::vector<pid_t>{12, 34, 5, 6, 7}));
}

TEST(slipstat_cli, Watch) {
  EXPECT_EQ(Parse({"-w"}).watch_s, kDefaultWatchS);
  EXPECT_EQ(Parse({"-w", "2"}).watch_s, 2);
  EXPECT_EQ(Parse({"-w0.5"}).watch_s, 0.5);
  EXPECT_EQ(Parse({"--watch=3"}).watch_s, 3);
  EXPECT_EQ(Parse({"--watch", "4"}).watch_s, 4);
  Options o = Parse({"-w", "-j"});  // an option after -w is not its period
  EXPECT_EQ(o.watch_s, kDefaultWatchS);
  EXPECT_TRUE(o.json);
}

TEST(slipstat_cli, BadArguments) {
  struct Case {
    std::initializer_list<const char*> args;
    const char* says;
  };
  const Case cases[] = {
      {{"--bogus"}, "unknown option '--bogus'"},
      {{"-x"}, "unknown option '-x'"},
      {{"-aj"}, "unknown option '-aj'"},
      {{"extra"}, "unexpected argument 'extra'"},
      {{"--all=yes"}, "--all takes no value"},
      {{"-p"}, "-p needs a value"},
      {{"-p", "abc"}, "bad pid 'abc'"},
      {{"-p", "0"}, "bad pid '0'"},
      {{"-p", "-5"}, "bad pid '-5'"},
      {{"--pid=1,,2"}, "bad pid ''"},
      {{"-p", "99999999999"}, "bad pid"},
      {{"-w", "abc"}, "bad refresh period 'abc'"},
      {{"-w", "0"}, "bad refresh period '0'"},
      {{"-w", "1e9"}, "bad refresh period"},
      {{"-w", "nan"}, "bad refresh period"},
      {{"--watch="}, "needs a value"},
      {{"--json", "--reasons"}, "do not go together"},
  };
  for (const Case& c : cases) {
    std::string error = ErrorOf(c.args);
    EXPECT_NE(error.find(c.says), std::string::npos)
        << *c.args.begin() << ": got \"" << error << "\", expected \"" << c.says << "\"";
  }
}

TEST(slipstat_cli, UsageNamesEveryOptionAndReason) {
  std::string usage = Usage();
  for (const char* option :
       {"--all", "--human", "--json", "--reasons", "--pid", "--watch", "--clean", "--help"}) {
    EXPECT_NE(usage.find(option), std::string::npos) << option;
  }
  for (int i = 0; i < static_cast<int>(slip::Reason::kCount); ++i) {
    const char* name = slip::ReasonName(static_cast<slip::Reason>(i));
    EXPECT_NE(usage.find(name), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace slipstat
