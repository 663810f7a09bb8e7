// endedNaming: a command's refusal asserted by the words a user looks for in it, not by its sentence.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "test_util.hpp"

namespace tiler::test {

// A command that ended with `code` and whose output names each of `words`: what a user looks for in the
// message (the file, the field, the value, the reason), not its sentence.
inline ::testing::AssertionResult endedNaming(const CommandResult& r, int code,
                                              std::initializer_list<const char*> words) {
  if (r.code != code)
    return ::testing::AssertionFailure() << "exit " << r.code << ", not " << code << ":\n" << r.output;
  for (const char* word : words)
    if (r.output.find(word) == std::string::npos)
      return ::testing::AssertionFailure() << "'" << word << "' is not named:\n" << r.output;
  return ::testing::AssertionSuccess();
}

}  // namespace tiler::test
