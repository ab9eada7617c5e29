// Writes the seed corpus of wire_fuzz into the directory given: one valid message of every type
// and field limit, so that mutation starts past the magic, length and checksum checks.
#include <cstdio>
#include <string>

#include "core/wire.h"
#include "tests/fuzz/wire_samples.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  int index = 0;
  for (const slip::wire::Message& msg : slip::wire::samples::All()) {
    uint8_t buf[slip::wire::kMaxMessageSize];
    const size_t len = slip::wire::EncodeMessage(msg, buf, sizeof buf);
    const std::string path = std::string(argv[1]) + "/seed-" + std::to_string(index++);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (len == 0 || f == nullptr || std::fwrite(buf, 1, len, f) != len || std::fclose(f) != 0) {
      std::perror(path.c_str());
      return 1;
    }
  }
  return 0;
}
