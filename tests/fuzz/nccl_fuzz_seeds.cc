// Writes seed scripts for nccl_fuzz into the directory given: a receiver that posts a
// grouped receive and gets well-formed frames for it, and a sender that gets a well-formed
// clear-to-send record and sends into it, so that the fuzzer starts from the deep paths.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "shm/msg_wire.h"

namespace {

using namespace slip::shm::msgwire;

void Put(std::vector<uint8_t>* out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out->insert(out->end(), b, b + n);
}

// The peer writes `bytes` (padded to a multiple of 4: the script writes 4*k bytes).
void PeerWrites(std::vector<uint8_t>* s, uint8_t op, std::vector<uint8_t> bytes) {
  while (bytes.size() % 4) bytes.push_back(0);
  s->push_back(op);
  s->push_back(uint8_t(bytes.size() / 4));
  Put(s, bytes.data(), bytes.size());
}

void Save(const char* dir, const char* name, const std::vector<uint8_t>& s) {
  const std::string path = std::string(dir) + "/" + name;
  if (FILE* f = fopen(path.c_str(), "wb")) {
    fwrite(s.data(), 1, s.size(), f);
    fclose(f);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  // Receiver: post two buffers (capacities 100 and 40, tags 3 and 4), then frames for both.
  std::vector<uint8_t> r = {0};
  r.insert(r.end(), {0, 1, 100, 0, 3, 40, 0, 4});
  for (uint16_t index : {1, 0}) {
    std::vector<uint8_t> frame;
    const uint64_t size = index == 0 ? 60 : 40;
    FrameHeader h{0, index, 0, size};
    Put(&frame, &h, sizeof(h));
    frame.resize(FrameBytes(size), 0x33);
    PeerWrites(&r, 1, frame);
  }
  r.push_back(5);
  Save(argv[1], "receiver", r);

  // Sender: one clear-to-send record for one buffer (tag 9, 500 bytes), a send into it,
  // credits, tests.
  std::vector<uint8_t> s = {1};
  CtsRecord cts{};
  cts.seq = 0;
  cts.count = 1;
  cts.entries[0] = {9, 0, 500};
  std::vector<uint8_t> record(kCtsBytes, 0);
  std::memcpy(record.data(), &cts, sizeof(cts));
  PeerWrites(&s, 1, record);
  s.insert(s.end(), {0, 200, 1, 9, 4, 3});
  const uint64_t credit = FrameBytes(456);
  Put(&s, &credit, sizeof(credit));
  s.push_back(4);
  Save(argv[1], "sender", s);
  return 0;
}
