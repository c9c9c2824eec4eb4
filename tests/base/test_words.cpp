// Words that leave the program (fp4/base/words.h): counted nouns and durations, worked by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "fp4/base/words.h"

namespace {

TEST(CountOf, SingularOnlyForOne) {
  EXPECT_EQ(fp4::count_of(1, "step"), "1 step");
  EXPECT_EQ(fp4::count_of(0, "step"), "0 steps");
  EXPECT_EQ(fp4::count_of(2, "step"), "2 steps");
  EXPECT_EQ(fp4::count_of(-1, "step"), "-1 steps");
  EXPECT_EQ(fp4::count_of(3, "batch", "batches"), "3 batches");
  EXPECT_EQ(fp4::count_of(1, "batch", "batches"), "1 batch");
}

TEST(DurationWords, EachUnitAndItsCarry) {
  EXPECT_EQ(fp4::duration_words(0), "0s");
  EXPECT_EQ(fp4::duration_words(59.4), "59s");
  EXPECT_EQ(fp4::duration_words(59.5), "1m00s");
  EXPECT_EQ(fp4::duration_words(185), "3m05s");
  EXPECT_EQ(fp4::duration_words(2 * 3600 + 7 * 60 + 10), "2h07m");
  EXPECT_EQ(fp4::duration_words(12 * 86400 + 3 * 3600 + 59), "12d03h");
}

// A run of 2^30 steps at 1 s a step is ~34 years: the ETA must stay a positive figure (an int
// conversion once printed "ETA -2147483648s"), and absurd or unknown values say so.
TEST(DurationWords, NeverNegative) {
  EXPECT_EQ(fp4::duration_words(1073741824.0), "12427d13h");
  EXPECT_EQ(fp4::duration_words(3e9), "34722d05h");  // beyond a 32-bit count of seconds
  EXPECT_EQ(fp4::duration_words(1e12), "> 99999d");
  EXPECT_EQ(fp4::duration_words(std::numeric_limits<double>::infinity()), "?");
  EXPECT_EQ(fp4::duration_words(std::nan("")), "?");
  EXPECT_EQ(fp4::duration_words(-1), "?");
}

}  // namespace
