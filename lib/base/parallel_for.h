// ParallelFor: runs the iterations of a loop whose iterations share nothing on several threads,
// for the schedule compiler's independent pieces of work (one link group's offload plan, one
// group's emitted programs). No pool: threads are started per call, which costs tens of
// microseconds against the tens of milliseconds of work each call splits, and leaves no thread
// behind in a library that a trainer links.
//
// Results never depend on the number of threads: every iteration runs exactly once, on one
// thread, and writes only what it owns. PO_COMPILE_THREADS (a positive integer) caps the number
// of threads; by default it is the machine's hardware concurrency. The cap holds for a loop and
// every loop nested in its bodies together: a ParallelFor inside another's body starts only
// threads that the outer loop leaves idle (none while all of them run outer iterations; those
// whose outer iterations have run out, or that a loop capped by max_threads never started), so
// a few large iterations of an outer loop can still spread their own loops over the machine.
#ifndef PIPEOFFLOAD_LIB_BASE_PARALLEL_FOR_H_
#define PIPEOFFLOAD_LIB_BASE_PARALLEL_FOR_H_

#include <cstdint>
#include <functional>

namespace pipeoffload::internal {

// The threads ParallelFor uses at most: PO_COMPILE_THREADS when it is a positive integer, else
// std::thread::hardware_concurrency() (1 when that is unknown).
int CompileThreads();

// Calls body(i) once for every i in [0, count), on up to CompileThreads() threads (the calling
// thread is one of them), and up to max_threads of them when max_threads > 0, and returns when
// every call has returned. Iterations are handed out one at a time in increasing order, so
// uneven ones balance. When a thread cannot be started, the threads that did start (or the
// caller alone) do all the work. Called from inside a ParallelFor body, it uses only the threads
// the outer loops leave idle (the file comment), and runs on the calling thread alone when there
// are none. When body throws (std::bad_alloc from a large schedule, say: the C ABI turns that
// into an error), no further iteration starts, and once every thread has joined the first
// exception is rethrown on the calling thread; iterations that had not started are then not run.
void ParallelFor(int count, const std::function<void(int)>& body, int max_threads = 0);

// Loops that touch fewer items than this (ops, say) run on the calling thread: a thread costs
// tens of microseconds to start, about what such a loop takes in all.
inline constexpr std::int64_t kItemsWorthThreads = std::int64_t{1} << 17;

// ParallelFor when the loop touches at least kItemsWorthThreads items in all (`items`, in the
// loop's own measure), else body(0), ..., body(count - 1) on the calling thread. For loops
// that run on schedules of every size, most of them small (the simulator, for one).
void ParallelForSized(int count, std::int64_t items, const std::function<void(int)>& body);

}  // namespace pipeoffload::internal

#endif  // PIPEOFFLOAD_LIB_BASE_PARALLEL_FOR_H_
