// Unit tests for fabric/options: the fabric transport's SLIP_* variables.
#include <gtest/gtest.h>

#include <string>

#include "fabric/options.h"
#include "tests/unit/fake_env.h"

namespace slip::fabric {
namespace {

using testing_env::Env;
using testing_env::Lookup;

TEST(FabricOptions, DefaultIsTheBestMatch) {
  Env env;
  Options o;
  ASSERT_TRUE(kOptionTable.Parse(Lookup, &env, &o, nullptr));
  EXPECT_TRUE(o.provider.empty());
}

TEST(FabricOptions, ProviderNamesAsFiInfoPrintsThem) {
  for (const char* name : {"tcp", "shm", "efa", "verbs;ofi_rxm", "tcp;ofi_rxm", "udp;ofi_rxd"}) {
    Env env{{"SLIP_FABRIC_PROVIDER", name}};
    Options o;
    std::string error;
    ASSERT_TRUE(kOptionTable.Parse(Lookup, &env, &o, &error)) << name << ": " << error;
    EXPECT_EQ(o.provider, name);
  }
}

// A bad value fails on one line naming it, and leaves the output untouched.
TEST(FabricOptions, BadProviderNames) {
  for (const std::string& bad :
       {std::string(""), std::string(";tcp"), std::string("tcp;"), std::string("tcp ofi_rxm"),
        std::string("shm\n"), std::string("../x"), std::string(64, 'a')}) {
    Env env{{"SLIP_FABRIC_PROVIDER", bad}};
    Options o;
    o.provider = "sentinel";
    std::string error;
    EXPECT_FALSE(kOptionTable.Parse(Lookup, &env, &o, &error)) << bad;
    EXPECT_EQ(error.rfind("SLIP_FABRIC_PROVIDER=\"", 0), 0u) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    EXPECT_EQ(o.provider, "sentinel");
  }
  const auto names = kOptionTable.names();
  ASSERT_EQ(names.size(), 5u);
  EXPECT_STREQ(names[0], "SLIP_FABRIC_PROVIDER");
  EXPECT_STREQ(names[1], "SLIP_FABRIC_ENDPOINT");
  EXPECT_STREQ(names[2], "SLIP_FABRIC_NOTES");
  EXPECT_STREQ(names[3], "SLIP_FABRIC_DATA");
  EXPECT_STREQ(names[4], "SLIP_NEGATIVE_TTL_MS");
}

// The streams' endpoints: auto (the default), msg (connected) or rdm (reliable datagrams).
TEST(FabricOptions, Endpoint) {
  Options o;
  EXPECT_EQ(o.endpoint, EndpointChoice::kAuto);
  const std::pair<const char*, EndpointChoice> good[] = {
      {"msg", EndpointChoice::kConnected},
      {"rdm", EndpointChoice::kDatagram},
      {"auto", EndpointChoice::kAuto},
  };
  for (const auto& [value, choice] : good) {
    Env env{{"SLIP_FABRIC_ENDPOINT", value}};
    std::string error;
    ASSERT_TRUE(kOptionTable.Parse(Lookup, &env, &o, &error)) << error;
    EXPECT_EQ(o.endpoint, choice) << value;
  }
  for (const char* bad : {"", "MSG", "FI_EP_MSG", "dgram", "msg "}) {
    Env env{{"SLIP_FABRIC_ENDPOINT", bad}};
    Options kept;
    kept.endpoint = EndpointChoice::kDatagram;
    std::string error;
    EXPECT_FALSE(kOptionTable.Parse(Lookup, &env, &kept, &error)) << bad;
    EXPECT_EQ(error.rfind("SLIP_FABRIC_ENDPOINT=\"", 0), 0u) << error;
    EXPECT_EQ(kept.endpoint, EndpointChoice::kDatagram);
  }
}

// The notes' form: word (the default) or inline (8-byte notes where the provider can).
TEST(FabricOptions, Notes) {
  Options o;
  EXPECT_TRUE(o.word_notes);
  for (const char* value : {"inline", "word"}) {
    Env env{{"SLIP_FABRIC_NOTES", value}};
    std::string error;
    ASSERT_TRUE(kOptionTable.Parse(Lookup, &env, &o, &error)) << error;
    EXPECT_EQ(o.word_notes, std::string(value) == "word");
  }
  for (const char* bad : {"", "WORD", "8", "auto"}) {
    Env env{{"SLIP_FABRIC_NOTES", bad}};
    Options kept;
    std::string error;
    EXPECT_FALSE(kOptionTable.Parse(Lookup, &env, &kept, &error)) << bad;
    EXPECT_EQ(error.rfind("SLIP_FABRIC_NOTES=\"", 0), 0u) << error;
    EXPECT_TRUE(kept.word_notes);
  }
}

// How bytes move: auto (the default), write (RMA) or send (posted receives).
TEST(FabricOptions, Data) {
  Options o;
  EXPECT_EQ(o.data, DataChoice::kAuto);
  const std::pair<const char*, DataChoice> good[] = {
      {"send", DataChoice::kSend},
      {"write", DataChoice::kWrite},
      {"auto", DataChoice::kAuto},
  };
  for (const auto& [value, choice] : good) {
    Env env{{"SLIP_FABRIC_DATA", value}};
    std::string error;
    ASSERT_TRUE(kOptionTable.Parse(Lookup, &env, &o, &error)) << error;
    EXPECT_EQ(o.data, choice) << value;
  }
  for (const char* bad : {"", "SEND", "rma", "msg", "send "}) {
    Env env{{"SLIP_FABRIC_DATA", bad}};
    Options kept;
    kept.data = DataChoice::kSend;
    std::string error;
    EXPECT_FALSE(kOptionTable.Parse(Lookup, &env, &kept, &error)) << bad;
    EXPECT_EQ(error.rfind("SLIP_FABRIC_DATA=\"", 0), 0u) << error;
    EXPECT_EQ(kept.data, DataChoice::kSend);
  }
}

// The negative cache's lifetime, read by verbs too: one value for both transports.
TEST(FabricOptions, NegativeTtl) {
  Options o;
  EXPECT_EQ(o.negative_ttl_ms, 10000u);
  {
    Env env{{"SLIP_NEGATIVE_TTL_MS", "0"}};
    std::string error;
    ASSERT_TRUE(kOptionTable.Parse(Lookup, &env, &o, &error)) << error;
    EXPECT_EQ(o.negative_ttl_ms, 0u);
  }
  for (const char* bad : {"-1", "3600001", "ten", ""}) {
    Env env{{"SLIP_NEGATIVE_TTL_MS", bad}};
    Options kept;
    std::string error;
    EXPECT_FALSE(kOptionTable.Parse(Lookup, &env, &kept, &error)) << bad;
    EXPECT_EQ(error.rfind("SLIP_NEGATIVE_TTL_MS=\"", 0), 0u) << error;
    EXPECT_EQ(kept.negative_ttl_ms, 10000u);
  }
}

}  // namespace
}  // namespace slip::fabric
