// Writes seed scripts for shm_fuzz into the directory named on the command line: a
// registration bent each way, and traffic the way a well-behaved peer makes it (publish,
// receive, send, credit), so that the fuzzer starts from the paths real peers take.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace {

void Write(const std::string& dir, const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::perror(path.c_str());
    return;
  }
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

void U16(std::vector<uint8_t>* out, uint16_t v) {
  out->push_back(uint8_t(v));
  out->push_back(uint8_t(v >> 8));
}

void U64(std::vector<uint8_t>* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(uint8_t(v >> (8 * i)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  for (int bend = 0; bend < 8; ++bend) {
    std::vector<uint8_t> reg = {1, uint8_t(1 << bend)};
    for (int i = 0; i < 24; ++i) reg.push_back(uint8_t(i * 37));
    Write(dir, "registration-" + std::to_string(bend), reg);
  }
  for (int victim = 0; victim < 2; ++victim) {
    std::vector<uint8_t> t = {0, uint8_t(victim)};
    for (int round = 0; round < 4; ++round) {
      t.push_back(3);  // publish 100 bytes
      U16(&t, 100);
      for (int i = 0; i < 100; ++i) t.push_back(uint8_t('a' + i % 26));
      t.push_back(1);  // receive 64
      U16(&t, 64);
      t.push_back(0);
      t.push_back(0);  // send 500
      U16(&t, 500);
      t.push_back(4);  // credit all of it
      U64(&t, uint64_t(500) * (round + 1));
      t.push_back(8);  // readiness
      t.push_back(0);
    }
    t.push_back(5);  // a cursor far out of range
    U64(&t, 1ull << 40);
    t.push_back(1);
    U16(&t, 4000);
    t.push_back(0);
    Write(dir, "traffic-" + std::to_string(victim), t);
  }
  return 0;
}
