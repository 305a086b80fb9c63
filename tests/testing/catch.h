// Catch2 v2 / v3 shim: the build machine has v2 (single header), the GPU machine v3.
#ifndef PIPEOFFLOAD_TESTS_TESTING_CATCH_H_
#define PIPEOFFLOAD_TESTS_TESTING_CATCH_H_

#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#else
#include <catch2/catch.hpp>
namespace Catch {
using Detail::Approx;
}  // namespace Catch
#endif

#endif  // PIPEOFFLOAD_TESTS_TESTING_CATCH_H_
