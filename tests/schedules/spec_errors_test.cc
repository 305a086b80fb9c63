#include "tests/testing/catch.h"
