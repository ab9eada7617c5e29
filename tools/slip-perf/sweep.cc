#include "tools/slip-perf/sweep.h"

#include <algorithm>
#include <random>
#include <stdexcept>

#include "tools/slip-perf/session.h"

namespace slipperf {
namespace {

uint32_t LinksOf(TestId test, const SweepOptions& o) {
  switch (test) {
    case TestId::kLat:
      return 1;
    case TestId::kBw:
      return o.streams;
    case TestId::kRr:
    case TestId::kCrr:
      return o.conns;
  }
  return 1;
}

}  // namespace

std::vector<Result> RunSweep(Link& control, Connector& connector, const SweepOptions& o,
                             const std::string& prefix) {
  std::random_device seeds;
  std::vector<Result> results;
  for (const TestId test : o.tests) {
    const std::string name = prefix + "_" + TestKind(test);
    std::vector<uint32_t> sizes = o.sizes;
    if (sizes.empty()) sizes = {test == TestId::kBw ? kDefaultBwSize : kDefaultLatSize};
    for (const uint32_t size : sizes) {
      TestRequest r;
      r.test = test;
      r.size = size;
      r.verify = o.verify;
      r.budget = o.budget;
      r.links = LinksOf(test, o);
      std::vector<Result> runs;
      for (uint32_t i = 0; i < o.repeat; ++i) {
        r.seed = (uint64_t{seeds()} << 32) | seeds();
        try {
          runs.push_back(RunTest(control, connector, r));
        } catch (const std::exception& e) {
          throw std::runtime_error(name + " " + HumanSize(size) + ": " + e.what());
        }
      }
      results.push_back(CombineRepeats(std::move(runs)));
      results.back().test = name;
    }
  }
  return results;
}

Result CombineRepeats(std::vector<Result> runs) {
  if (runs.empty()) throw std::logic_error("no runs to combine");
  std::sort(runs.begin(), runs.end(),
            [](const Result& a, const Result& b) { return FigureValue(a) < FigureValue(b); });
  Result median = runs[(runs.size() - 1) / 2];
  median.spread = {.min = FigureValue(runs.front()),
                   .median = FigureValue(median),
                   .max = FigureValue(runs.back()),
                   .repeats = static_cast<uint32_t>(runs.size())};
  return median;
}

}  // namespace slipperf
