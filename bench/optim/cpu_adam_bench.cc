// cpu_adam_bench: CPU Adam (include/pipeoffload/adam.h) against the host's measured memory
// bandwidth (issue 6: >= 85% of it), per ISA and thread count.
//
// 1. STREAM-like passes on a WorkerPool of t threads (the pool CpuAdam uses), over arrays much
//    larger than the last-level cache, for each thread count t:
//      triad        a[i] = b[i] + s * c[i]            12 B/element (STREAM's count: 2 read, 1 write)
//      adam-shaped  read p, m, v, g; write p, m, v    28 B/element (4 streams read, 3 written)
//    The adam-shaped figure is the ceiling for Adam (same streams, trivial arithmetic).
// 2. CpuAdam::Update for each ISA and thread count, with and without the bf16 copy, with fp32 or
//    bf16 gradients (AdamSpan::grad / grad_bf16). Bytes counted per parameter: read p, m, v (12)
//    + the gradient (4 fp32, 2 bf16) + write p, m, v (12) = 28 (fp32 gradient) or 26 (bf16), + 2
//    for the bf16 copy = 30 or 28. Write-allocate reads of the bf16 array are not counted (as
//    STREAM does not). Rows with bf16 gradients are named "... bf16-grad". Reported as params/s,
//    GB/s and % of the adam-shaped pass at the same thread count.
//    With --master=split (or fp32,split) also the split master (AdamSpan::param_lo: the fp32
//    master kept as its bf16 high half, which is the bf16 copy, and its low half): read hi, lo,
//    m, v (12) + the gradient + write hi, lo, m, v (12) = 28 (fp32 gradient) or 26 (bf16) B per
//    param, rows named "cpu_adam-<isa>+split". These rows ignore --bf16 (their hi is the copy).
// Every figure is the median of --reps timed runs after --warmup untimed ones. GB/s = 1e9 B/s.
//
// Flags: --params=N (2^24; --big: 2^28 = 4.3 GB of state + 0.5 GB bf16)
//        --threads=sweep|all|1,2,4 (sweep: 1, 2, 4, ... and every CPU we may use)
//        --isas=scalar,avx2,avx512 (default: every one this CPU runs)
//        --bf16=both|on|off (both)  --grad=fp32,bf16 (both)  --master=fp32,split (fp32)
//        --reps=N (5)  --warmup=N (1)
//        --json=PATH (also write the results as JSON)  --no-stream  --smoke (2^16, 1 rep)
//        --prefetch=0,1024,...: CpuAdamOptions::prefetch_bytes values to measure (-1: by CPU
//          vendor; rows name the distance used when it is not 0)
//        --skew=P,M,V,G,B: where each array starts, in cache lines past a page boundary
//          (default 0,13,26,39,52; 0,0,0,0,0 shows what same-offset arrays cost; a split
//          master's lo takes P's, its hi B's)
//        --help lists them (the table CpuAdamFlags); bad flags exit 2.
// Prints a markdown table (with date, CPU and command) on stdout.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "examples/common/flags.h"
#include "lib/optim/worker_pool.h"
#include "nlohmann/json.hpp"
#include "pipeoffload/adam.h"

namespace pipeoffload {
namespace {

using internal::WorkerPool;
using nlohmann::json;

constexpr double kTriadBytes = 12.0;        // per element: b, c read; a written
constexpr double kAdamShapedBytes = 28.0;   // per element: p, m, v, g read; p, m, v written
constexpr double kAdamBytes = 28.0;         // per param, without the bf16 copy
constexpr double kAdamBf16Bytes = 30.0;     // per param, with it
constexpr double kAdamSplitBytes = 28.0;    // per param, split master: hi, lo, m, v, g
constexpr double kBf16GradSaving = 2.0;     // per param: a bf16 gradient is 2 B instead of 4

// Bytes per param of one CpuAdam row (`split`: a split master, whose hi is the bf16 copy).
double AdamBytes(bool with_bf16, bool bf16_grad, bool split = false) {
  const double base = split ? kAdamSplitBytes : with_bf16 ? kAdamBf16Bytes : kAdamBytes;
  return base - (bf16_grad ? kBf16GradSaving : 0.0);
}

struct Flags {
  std::int64_t params = std::int64_t{1} << 24;
  std::string threads = "sweep";  // sweep, all, or list: the counts in thread_list
  std::vector<int> thread_list;
  std::vector<CpuIsa> isas;
  std::string bf16 = "both";
  std::vector<bool> bf16_grads = {false, true};  // --grad: fp32 and/or bf16 gradients
  std::vector<bool> split_masters = {false};     // --master: fp32 and/or split masters
  int reps = 5;
  int warmup = 1;
  std::string json_path;
  bool no_stream = false;
  std::vector<int> skews = {0, 13, 26, 39, 52};  // p, m, v, g, bf16: see Array
  std::vector<int> prefetch = {-1};              // CpuAdamOptions::prefetch_bytes values
  std::string command;
  bool help = false;
};

using Flag = examples::FlagDef<Flags>;
constexpr CpuIsa kIsas[] = {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512};

// A list of two choices, each item true for the second: --grad (fp32,bf16), --master (fp32,split).
Flag PairListFlag(std::string_view name, std::string_view value_name, std::string_view help,
                  std::vector<bool> Flags::*field, std::string_view first,
                  std::string_view second) {
  return {name, value_name, help, [=](Flags& f, const std::string& value) -> absl::Status {
            PO_ASSIGN_OR_RETURN(const std::vector<int> items,
                                examples::ParseFlagChoices(name, value, {first, second}));
            (f.*field).assign(items.begin(), items.end());
            return absl::OkStatus();
          }};
}

const std::vector<Flag>& CpuAdamFlags() {
  using examples::IntFlag;
  static const auto* const kFlags = new std::vector<Flag>{
      IntFlag("params", "N", "parameters of the arrays (default 2^24).", &Flags::params, 1,
              std::int64_t{1} << 40),
      {"big", "", "2^28 parameters: 4.3 GB of state + 0.5 GB bf16.",
       [](Flags& f, const std::string&) {
         f.params = std::int64_t{1} << 28;
         return absl::OkStatus();
       }},
      {"smoke", "", "2^16 parameters, 1 rep, no warm-up (the CTest run).",
       [](Flags& f, const std::string&) {
         f.params = std::int64_t{1} << 16;
         f.reps = 1;
         f.warmup = 0;
         return absl::OkStatus();
       }},
      {"threads", "sweep|all|N,N,...",
       "thread counts: sweep (default: 1, 2, 4, ... and every CPU we may use), all (every CPU we "
       "may use), or a list.",
       [](Flags& f, const std::string& value) -> absl::Status {
         f.threads = value == "sweep" || value == "all" ? value : "list";
         if (f.threads != "list") return absl::OkStatus();
         absl::StatusOr<std::vector<std::int64_t>> counts =
             examples::ParseFlagInts("threads", value, 1, 1 << 16);
         if (!counts.ok()) {
           return examples::BadFlagValue(
               "threads", "sweep, all or a comma-separated list of counts in [1, 65536]", value);
         }
         f.thread_list.assign(counts->begin(), counts->end());
         return absl::OkStatus();
       }},
      {"isas", "ISA,...",
       "scalar, avx2, avx512: the ISAs to measure (default: every one this CPU runs).",
       [](Flags& f, const std::string& value) -> absl::Status {
         PO_ASSIGN_OR_RETURN(const std::vector<int> items,
                             examples::ParseFlagChoices("isas", value,
                                                        {CpuIsaName(kIsas[0]), CpuIsaName(kIsas[1]),
                                                         CpuIsaName(kIsas[2])}));
         f.isas.clear();
         for (const int i : items) {
           if (!CpuSupports(kIsas[i])) {
             return absl::InvalidArgumentError(
                 absl::StrCat("--isas: this CPU cannot run ", std::string(CpuIsaName(kIsas[i]))));
           }
           f.isas.push_back(kIsas[i]);
         }
         return absl::OkStatus();
       }},
      {"bf16", "both|on|off", "rows with the bf16 copy, without it, or both (default both).",
       [](Flags& f, const std::string& value) -> absl::Status {
         PO_RETURN_IF_ERROR(
             examples::ParseFlagChoice("bf16", value, {"both", "on", "off"}).status());
         f.bf16 = value;
         return absl::OkStatus();
       }},
      PairListFlag("grad", "fp32,bf16", "gradient types (default both).", &Flags::bf16_grads,
                   "fp32", "bf16"),
      PairListFlag("master", "fp32,split",
                   "master types (default fp32); split: the fp32 master kept as its bf16 high "
                   "half and its low half, rows cpu_adam-<isa>+split, which ignore --bf16.",
                   &Flags::split_masters, "fp32", "split"),
      IntFlag("reps", "N", "timed runs, the median kept (default 5).", &Flags::reps, 1, 1000000),
      IntFlag("warmup", "N", "untimed runs before them (default 1).", &Flags::warmup, 0, 1000000),
      examples::TextFlag("json", "PATH", "also write the results as JSON here.",
                         &Flags::json_path),
      examples::SwitchFlag("no-stream", "skip the STREAM-like passes.", &Flags::no_stream),
      {"prefetch", "B,B,...",
       "CpuAdamOptions::prefetch_bytes values to measure (default -1: by CPU vendor; rows name "
       "the distance used when it is not 0).",
       [](Flags& f, const std::string& value) -> absl::Status {
         PO_ASSIGN_OR_RETURN(const std::vector<std::int64_t> bytes,
                             examples::ParseFlagInts("prefetch", value, -1, 1 << 30));
         f.prefetch.assign(bytes.begin(), bytes.end());
         return absl::OkStatus();
       }},
      {"skew", "P,M,V,G,B",
       "where each array starts, in cache lines past a page boundary (default 0,13,26,39,52; "
       "0,0,0,0,0 shows what same-offset arrays cost; a split master's lo takes P's, its hi "
       "B's).",
       [](Flags& f, const std::string& value) -> absl::Status {
         absl::StatusOr<std::vector<std::int64_t>> lines =
             examples::ParseFlagInts("skew", value, 0, 63);
         if (!lines.ok() || lines->size() != 5) {
           return examples::BadFlagValue(
               "skew", "5 cache-line counts p,m,v,g,bf16, each in [0, 63] (one page)", value);
         }
         f.skews.assign(lines->begin(), lines->end());
         return absl::OkStatus();
       }},
      examples::HelpFlag(&Flags::help),
  };
  return *kFlags;
}

constexpr char kHelpHeader[] =
    "usage: cpu_adam_bench [flags]\n"
    "\n"
    "CPU Adam (pipeoffload/adam.h) against the host's measured memory bandwidth, per ISA and\n"
    "thread count: STREAM-like triad and adam-shaped passes, then CpuAdam params/s, GB/s and\n"
    "% of the adam-shaped pass. Prints a markdown table (date, CPU, command) on stdout.\n";

std::string HelpText() { return examples::FlagsHelpText(kHelpHeader, CpuAdamFlags()); }

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  flags.command = examples::CommandLine(argc, argv);
  PO_RETURN_IF_ERROR(examples::ParseFlags(examples::FlagArgs(argc, argv), CpuAdamFlags(), flags));
  if (flags.isas.empty()) {
    for (CpuIsa isa : kIsas) {
      if (CpuSupports(isa)) flags.isas.push_back(isa);
    }
  }
  return flags;
}

// Thread counts of --threads; `all` is what CpuAdam uses with threads = 0.
std::vector<int> ThreadCounts(const Flags& flags, int all) {
  if (flags.threads == "list") return flags.thread_list;
  std::vector<int> counts;
  if (flags.threads == "sweep") {
    for (int t = 1; t < all; t *= 2) counts.push_back(t);
  }
  counts.push_back(all);
  return counts;
}

// Uninitialized (first touch decides NUMA placement: see Fill), with transparent huge pages
// requested (fewer TLB misses on multi-GB arrays). The data starts `skew_lines` cache lines past
// a page boundary: with all arrays at the same offset in a page, element i of every stream
// shares its low 12 address bits, and the adam-shaped pass ran ~4x slower on AMD Zen 4 (CpuAdam
// ~30% slower; see adam.h). --skew=0,0,0,0,0 measures that case.
template <typename T>
struct Array {
  Array(std::int64_t count, int skew_lines) {
    const std::size_t skew = static_cast<std::size_t>(skew_lines) * 64;
    bytes = (static_cast<std::size_t>(count) * sizeof(T) + skew + 4095) / 4096 * 4096;
    base = std::aligned_alloc(4096, bytes);
    if (base == nullptr) {
      std::fprintf(stderr, "cpu_adam_bench: cannot allocate %zu bytes\n", bytes);
      std::exit(1);
    }
#if defined(MADV_HUGEPAGE)
    madvise(base, bytes, MADV_HUGEPAGE);  // advisory: failure is fine
#endif
    data = reinterpret_cast<T*>(static_cast<char*>(base) + skew);
  }
  ~Array() { std::free(base); }
  Array(const Array&) = delete;
  Array& operator=(const Array&) = delete;
  T& operator[](std::int64_t i) { return data[i]; }
  void* base = nullptr;
  std::size_t bytes = 0;
  T* data = nullptr;
};

// Runs body(begin, end) over [0, count) cut into `pool.size()` cache-line aligned parts.
void ParallelFor(WorkerPool& pool, std::int64_t count,
                 const std::function<void(std::int64_t, std::int64_t)>& body) {
  const std::vector<std::int64_t> bounds = internal::AlignedSplit(count, pool.size(), 16, 0);
  pool.Run(pool.size(), [&](int part) {
    body(bounds[static_cast<std::size_t>(part)], bounds[static_cast<std::size_t>(part) + 1]);
  });
}

double Seconds(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double MedianSeconds(const Flags& flags, const std::function<void()>& run) {
  for (int i = 0; i < flags.warmup; ++i) run();
  std::vector<double> times;
  for (int i = 0; i < flags.reps; ++i) times.push_back(Seconds(run));
  std::sort(times.begin(), times.end());
  const std::size_t n = times.size();
  return n % 2 == 1 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
}

struct State {
  // `skews`: each array's start, in cache lines past a page boundary; the bf16 gradients take
  // g's (a run reads one of the two), a split master's low halves p's (its runs do not read p;
  // bf16 holds its high halves). They are allocated only when `bf16_grads` / `split`.
  State(std::int64_t n, const std::vector<int>& skews, bool bf16_grads, bool split)
      : count(n), p(n, skews[0]), m(n, skews[1]), v(n, skews[2]), g(n, skews[3]),
        bf16(n, skews[4]), g_bf16(bf16_grads ? n : 0, skews[3]), lo(split ? n : 0, skews[0]),
        has_g_bf16(bf16_grads), has_lo(split) {}
  std::int64_t count;
  Array<float> p, m, v, g;
  Array<std::uint16_t> bf16;
  Array<std::uint16_t> g_bf16;
  Array<std::uint16_t> lo;
  bool has_g_bf16;
  bool has_lo;
};

// Adam-like values (no denormals: they would slow some CPUs down), written by the threads
// that will later run on each part.
void Fill(WorkerPool& pool, State& s) {
  ParallelFor(pool, s.count, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      const float x = static_cast<float>(i % 1000) * 1e-3f - 0.5f;
      s.p[i] = x;
      s.m[i] = x * 1e-2f;
      s.v[i] = 1e-4f + x * x * 1e-4f;
      s.g[i] = x * 3e-2f + 1e-3f;
      s.bf16[i] = 0;
      if (s.has_g_bf16) s.g_bf16[i] = FloatToBf16Bits(s.g[i]);
      if (s.has_lo) {
        // The split master p, its hi in bf16 (the +bf16 rows overwrite it with their p rounded
        // to nearest even: joined with any lo, that is within a bf16 ulp of p, still Adam-like).
        const SplitBf16 halves = SplitMaster(x);
        s.bf16[i] = halves.hi;
        s.lo[i] = halves.lo;
      }
    }
  });
}

struct StreamRow {
  int threads = 0;
  double triad_gbs = 0.0;
  double adam_shaped_gbs = 0.0;
};

// The STREAM-like loops, vectorized by the compiler (-O3) for each ISA and picked at load time
// by the CPU's features (GCC function multi-versioning), so the ceiling is measured with the
// widest vectors this CPU has, as the Adam kernels use.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PO_BENCH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PO_BENCH_CLONES
#endif

PO_BENCH_CLONES void TriadRange(float* __restrict a, const float* __restrict b,
                                const float* __restrict c, std::int64_t begin,
                                std::int64_t end) {
  for (std::int64_t i = begin; i < end; ++i) a[i] = b[i] + 0.5f * c[i];
}

// Loads first, then stores, as the Adam kernels do.
PO_BENCH_CLONES void AdamShapedRange(float* __restrict p, float* __restrict m,
                                     float* __restrict v, const float* __restrict g,
                                     std::int64_t begin, std::int64_t end) {
  for (std::int64_t i = begin; i < end; ++i) {
    const float pi = p[i], mi = m[i], vi = v[i], gi = g[i];
    p[i] = pi - 1e-3f * gi;
    m[i] = 0.5f * mi + gi;
    v[i] = 0.5f * vi + gi;
  }
}

StreamRow MeasureStream(const Flags& flags, int threads, State& s) {
  WorkerPool pool(threads);
  const std::int64_t n = s.count;
  StreamRow row;
  row.threads = threads;
  const double triad = MedianSeconds(flags, [&] {
    ParallelFor(pool, n, [&](std::int64_t begin, std::int64_t end) {
      TriadRange(s.p.data, s.m.data, s.v.data, begin, end);
    });
  });
  row.triad_gbs = kTriadBytes * static_cast<double>(n) / triad / 1e9;
  const double shaped = MedianSeconds(flags, [&] {
    ParallelFor(pool, n, [&](std::int64_t begin, std::int64_t end) {
      AdamShapedRange(s.p.data, s.m.data, s.v.data, s.g.data, begin, end);
    });
  });
  row.adam_shaped_gbs = kAdamShapedBytes * static_cast<double>(n) / shaped / 1e9;
  return row;
}

struct AdamRow {
  CpuIsa isa = CpuIsa::kScalar;
  int threads = 0;
  bool bf16 = false;  // a bf16 copy written (always, for a split master: its hi)
  bool bf16_grad = false;
  bool split = false;
  int prefetch = 0;
  double seconds = 0.0;
  double params_per_s = 0.0;
  double gbs = 0.0;
  double pct_of_stream = 0.0;  // of the adam-shaped pass at the same thread count (0: none)
};

AdamRow MeasureAdam(const Flags& flags, CpuIsa isa, int threads, bool with_bf16, bool bf16_grad,
                    bool split, int prefetch, State& s) {
  CpuAdamOptions options;
  options.threads = threads;
  options.isa = isa;
  options.pick_best_isa = false;
  options.prefetch_bytes = prefetch;
  auto cpu_adam = CpuAdam::Create(options);
  if (!cpu_adam.ok()) {
    std::fprintf(stderr, "cpu_adam_bench: %s\n", std::string(cpu_adam.status().message()).c_str());
    std::exit(1);
  }
  AdamOptions adam;
  adam.weight_decay = 0.01f;
  auto scalars = MakeAdamStepScalars(adam, 10);
  if (!scalars.ok()) std::exit(1);
  AdamSpan span;
  span.param = s.p.data;
  span.exp_avg = s.m.data;
  span.exp_avg_sq = s.v.data;
  span.grad = bf16_grad ? nullptr : s.g.data;
  span.grad_bf16 = bf16_grad ? s.g_bf16.data : nullptr;
  span.param_bf16 = with_bf16 || split ? s.bf16.data : nullptr;
  if (split) {
    span.param = nullptr;
    span.param_lo = s.lo.data;
  }
  span.count = s.count;
  AdamRow row;
  row.isa = isa;
  row.threads = threads;
  row.bf16 = with_bf16 || split;
  row.bf16_grad = bf16_grad;
  row.split = split;
  row.prefetch = (*cpu_adam)->prefetch_bytes();
  row.seconds = MedianSeconds(flags, [&] {
    const absl::Status status = (*cpu_adam)->Update(*scalars, span);
    if (!status.ok()) {
      std::fprintf(stderr, "cpu_adam_bench: %s\n", std::string(status.message()).c_str());
      std::exit(1);
    }
  });
  row.params_per_s = static_cast<double>(s.count) / row.seconds;
  row.gbs = row.params_per_s * AdamBytes(with_bf16, bf16_grad, split) / 1e9;
  return row;
}

std::string CpuModel() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  return text;
}

int Main(int argc, char** argv) {
  const absl::StatusOr<Flags> parsed = ParseFlags(argc, argv);
  if (const std::optional<int> exit = examples::FlagsExitCode("cpu_adam_bench", parsed, HelpText)) {
    return *exit;  // --help, or bad flags (2)
  }
  const Flags& flags = *parsed;
  auto probe = CpuAdam::Create();
  if (!probe.ok()) return 1;
  const int all = (*probe)->threads();
  probe->reset();
  const std::vector<int> thread_counts = ThreadCounts(flags, all);
  const int max_threads = *std::max_element(thread_counts.begin(), thread_counts.end());

  const bool any_bf16_grad =
      std::find(flags.bf16_grads.begin(), flags.bf16_grads.end(), true) != flags.bf16_grads.end();
  const bool any_split = std::find(flags.split_masters.begin(), flags.split_masters.end(),
                                   true) != flags.split_masters.end();
  State state(flags.params, flags.skews, any_bf16_grad, any_split);
  WorkerPool fill_pool(max_threads);
  Fill(fill_pool, state);

  // p, m, v, g and bf16 (18 B/param), + 2 for the bf16 gradients, + 2 for a split master's lo.
  const double state_gb = static_cast<double>(flags.params) *
                          (18.0 + (any_bf16_grad ? 2.0 : 0.0) + (any_split ? 2.0 : 0.0)) / 1e9;
  std::printf("## cpu_adam_bench, %s\n\n", UtcNow().c_str());
  std::printf("CPU: %s; %d CPUs usable; best ISA %s. Command: `%s`\n\n", CpuModel().c_str(), all,
              std::string(CpuIsaName(BestCpuIsa())).c_str(), flags.command.c_str());
  std::printf("%lld params (%.2f GB of p, m, v, g%s%s and bf16); median of %d reps after %d "
              "warm-up.\n\n",
              static_cast<long long>(flags.params), state_gb, any_bf16_grad ? ", bf16 g" : "",
              any_split ? ", split lo" : "", flags.reps, flags.warmup);

  std::vector<StreamRow> stream;
  if (!flags.no_stream) {
    std::printf("| threads | triad GB/s (12 B/elem) | adam-shaped GB/s (28 B/elem) |\n");
    std::printf("|---|---|---|\n");
    for (int t : thread_counts) {
      stream.push_back(MeasureStream(flags, t, state));
      std::printf("| %d | %.1f | %.1f |\n", t, stream.back().triad_gbs,
                  stream.back().adam_shaped_gbs);
      std::fflush(stdout);
    }
    std::printf("\n");
    Fill(fill_pool, state);  // the passes above left arbitrary values
  }

  // (bf16 copy, bf16 gradient, split master) combinations, in the order they are measured. A
  // split master always writes its bf16 copy (hi): --bf16 does not apply to it.
  struct Mode {
    bool with_bf16;
    bool bf16_grad;
    bool split;
  };
  std::vector<Mode> modes;
  for (const bool split : flags.split_masters) {
    for (const bool with_bf16 : {true, false}) {
      if (split && !with_bf16) continue;
      if (!split && flags.bf16 == (with_bf16 ? "off" : "on")) continue;
      for (const bool bf16_grad : flags.bf16_grads) modes.push_back({with_bf16, bf16_grad, split});
    }
  }
  std::printf("B/param: p, m, v read and written (24) + the gradient read (4 fp32, 2 in rows "
              "named bf16-grad) + the bf16 copy written (2, rows named +bf16); a split master "
              "(rows named +split) reads and writes hi, lo, m, v (24) + the gradient; "
              "write-allocate reads not counted.\n\n");
  std::printf("| kernel | threads | params | B/param | median ms | G params/s | GB/s | "
              "%% of adam-shaped |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  std::vector<AdamRow> rows;
  for (CpuIsa isa : flags.isas) {
    for (const auto& [with_bf16, bf16_grad, split] : modes) {
      for (int prefetch : flags.prefetch) {
        for (int t : thread_counts) {
          AdamRow row = MeasureAdam(flags, isa, t, with_bf16, bf16_grad, split, prefetch, state);
          for (const StreamRow& s : stream) {
            if (s.threads == t) row.pct_of_stream = 100.0 * row.gbs / s.adam_shaped_gbs;
          }
          char percent[32] = "-";
          if (row.pct_of_stream > 0) {
            std::snprintf(percent, sizeof(percent), "%.1f%%", row.pct_of_stream);
          }
          char name[64];
          std::snprintf(name, sizeof(name), "cpu_adam-%s%s%s",
                        std::string(CpuIsaName(isa)).c_str(),
                        split ? "+split" : with_bf16 ? "+bf16" : "",
                        bf16_grad ? " bf16-grad" : "");
          if (row.prefetch > 0) {
            const std::string base = name;
            std::snprintf(name, sizeof(name), "%s pf%d", base.c_str(), row.prefetch);
          }
          std::printf("| %s | %d | %lld | %.0f | %.2f | %.3f | %.1f | %s |\n", name, t,
                      static_cast<long long>(flags.params), AdamBytes(with_bf16, bf16_grad, split),
                      row.seconds * 1e3, row.params_per_s / 1e9, row.gbs, percent);
          std::fflush(stdout);
          rows.push_back(row);
        }
      }
    }
  }

  if (!flags.json_path.empty()) {
    json out;
    out["date"] = UtcNow();
    out["cpu"] = CpuModel();
    out["cpus_usable"] = all;
    out["best_isa"] = std::string(CpuIsaName(BestCpuIsa()));
    out["command"] = flags.command;
    out["params"] = flags.params;
    out["reps"] = flags.reps;
    out["warmup"] = flags.warmup;
    out["bytes_per_param"] = {{"adam", AdamBytes(false, false)},
                              {"adam_bf16", AdamBytes(true, false)},
                              {"adam_bf16_grad", AdamBytes(false, true)},
                              {"adam_bf16_bf16_grad", AdamBytes(true, true)},
                              {"adam_split", AdamBytes(true, false, true)},
                              {"adam_split_bf16_grad", AdamBytes(true, true, true)}};
    out["stream"] = json::array();
    for (const StreamRow& s : stream) {
      out["stream"].push_back({{"threads", s.threads},
                               {"triad_gbs", s.triad_gbs},
                               {"adam_shaped_gbs", s.adam_shaped_gbs}});
    }
    out["adam"] = json::array();
    for (const AdamRow& r : rows) {
      out["adam"].push_back({{"isa", std::string(CpuIsaName(r.isa))},
                             {"threads", r.threads},
                             {"bf16", r.bf16},
                             {"grad", r.bf16_grad ? "bf16" : "fp32"},
                             {"master", r.split ? "split" : "fp32"},
                             {"bytes_per_param", AdamBytes(r.bf16, r.bf16_grad, r.split)},
                             {"prefetch_bytes", r.prefetch},
                             {"median_s", r.seconds},
                             {"params_per_s", r.params_per_s},
                             {"gbs", r.gbs},
                             {"pct_of_adam_shaped", r.pct_of_stream}});
    }
    std::ofstream file(flags.json_path);
    file << out.dump(2) << "\n";
    if (!file) {
      std::fprintf(stderr, "cpu_adam_bench: cannot write %s\n", flags.json_path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace pipeoffload

int main(int argc, char** argv) { return pipeoffload::Main(argc, argv); }
