// Replay a fuzz target over files: `replay_<target> [--exact] PATH...`, each PATH a file or a
// directory (every regular file in it, sorted). Runs LLVMFuzzerTestOneInput of the target on
// each file, so every input of tests/fuzz/corpus/<target>/ (seeds and the inputs of fixed
// findings) is a regression test of the default build, without clang or libFuzzer. A failed
// property traps (the test fails); a finding's exception escapes and terminates. --exact sets
// g_fuzz_exact for the paths after it (files fp4train wrote: re-serialised byte for byte).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  size_t n = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--exact") {
      g_fuzz_exact = true;
      continue;
    }
    std::vector<fs::path> files;
    if (fs::is_directory(arg)) {
      for (const auto& e : fs::directory_iterator(arg))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
    } else if (fs::is_regular_file(arg)) {
      files.push_back(arg);
    } else {
      std::fprintf(stderr, "replay: %s: no such file or directory\n", arg.c_str());
      return 2;
    }
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      const std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::fprintf(stderr, "replay: %s (%zu bytes)\n", f.c_str(), b.size());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(b.data()), b.size());
      ++n;
    }
  }
  if (n == 0) {
    std::fprintf(stderr, "replay: no input files\n");
    return 2;
  }
  std::printf("replay: %zu inputs, no finding\n", n);
  return 0;
}
