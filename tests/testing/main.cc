// Shared main for the Catch2 test binaries (v2 needs CATCH_CONFIG_RUNNER, v3 catch_session.hpp).
#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

int main(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
