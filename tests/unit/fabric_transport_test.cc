// Unit tests for fabric/transport.h: which loaded objects' code the face leaves to libc.
#include <gtest/gtest.h>

#include "fabric/library_path.h"

namespace slip::fabric {
namespace {

TEST(FabricTransport, LibfabricAndItsProvidersAreTransportCode) {
  for (const char* path :
       {"/lib/x86_64-linux-gnu/libfabric.so.1", "/usr/lib/x86_64-linux-gnu/libfabric/libefa-fi.so",
        "/opt/ofi/lib/libfabric.so.1.18.0"})
    EXPECT_TRUE(IsTransportLibraryPath(path)) << path;
}

// The module's own progress thread sleeps in ppoll: the face must not take it for the
// application's (it armed the application's streams and wrote their tokens).
TEST(FabricTransport, TheStreamModuleIsTransportCode) {
  EXPECT_TRUE(IsTransportLibraryPath("/usr/lib/slipstream/libslipstream-fabric.so"));
  EXPECT_TRUE(IsTransportLibraryPath("/work/build/lib/libslipstream-fabric.so"));
}

TEST(FabricTransport, TheApplicationAndTheFaceAreNot) {
  for (const char* path : {"/usr/lib/slipstream/libslipstream.so", "/usr/bin/iperf3",
                           "/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/libiperf.so.0",
                           "/usr/lib/slipstream/libslipstream-verbs.so", ""})
    EXPECT_FALSE(IsTransportLibraryPath(path)) << path;
}

}  // namespace
}  // namespace slip::fabric
