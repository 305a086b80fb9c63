message(STATUS "package placeholder")
