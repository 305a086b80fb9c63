/* The expectations of the C ABI's test programs (C99): each failed one prints its place and the
 * library's message and is counted in `failures`, so one run reports every broken expectation.
 * Include once per program (the counter and helper are the program's own). */
#ifndef PIPEOFFLOAD_TESTS_C_API_EXPECT_H_
#define PIPEOFFLOAD_TESTS_C_API_EXPECT_H_

#include <stdio.h>
#include <string.h>

#include "pipeoffload/c_api.h"

static int failures = 0;

/* Records a failure with its place and goes on, so one run reports every broken expectation. */
#define EXPECT(condition)                                                        \
  do {                                                                           \
    if (!(condition)) {                                                          \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #condition);  \
      ++failures;                                                                \
    }                                                                            \
  } while (0)

/* A call that must succeed; on failure prints the library's message. */
#define EXPECT_OK(call)                                                                 \
  do {                                                                                  \
    po_status status_ = (call);                                                         \
    if (status_ != PO_OK) {                                                             \
      fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,          \
              po_status_name(status_), po_last_error_message());                        \
      ++failures;                                                                       \
    }                                                                                   \
  } while (0)

/* A call that must fail with `code` and exactly `message` (c_api.h's thread-local message). */
#define EXPECT_ERROR(call, code, message) \
  ExpectError((call), (code), (message), #call, __FILE__, __LINE__)

static void ExpectError(po_status got, po_status code, const char* message, const char* call,
                        const char* file, int line) {
  const char* got_message = po_last_error_message();
  if (got != code || strcmp(got_message, message) != 0) {
    fprintf(stderr, "%s:%d: %s\n  returned %s: \"%s\"\n  expected %s: \"%s\"\n", file, line,
            call, po_status_name(got), got_message, po_status_name(code), message);
    ++failures;
  }
}

/* Like EXPECT_ERROR for messages too long to spell out (validator grids): code and prefix. */
#define EXPECT_ERROR_PREFIX(call, code, prefix)                                              \
  do {                                                                                      \
    po_status status_ = (call);                                                             \
    const char* message_ = po_last_error_message();                                         \
    if (status_ != (code) || strncmp(message_, (prefix), strlen(prefix)) != 0) {            \
      fprintf(stderr, "%s:%d: %s\n  returned %s: \"%s\"\n  expected %s: \"%s...\"\n",       \
              __FILE__, __LINE__, #call, po_status_name(status_), message_,                 \
              po_status_name(code), (prefix));                                              \
      ++failures;                                                                           \
    }                                                                                       \
  } while (0)

#endif /* PIPEOFFLOAD_TESTS_C_API_EXPECT_H_ */
