#include "dtrain/core/env.hpp"

#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

using dtrain::detail::ParseStatus;

TEST_CASE("booleans: 0/1/true/false/yes/no/on/off in any case, nothing else") {
  using dtrain::detail::parse_bool_text;
  for (const char* yes : {"1", "true", "TRUE", "True", "yes", "YES", "on", "On"}) {
    CHECK_MESSAGE(parse_bool_text(yes) == true, yes);
  }
  for (const char* no : {"0", "false", "FALSE", "no", "No", "off", "OFF"}) {
    CHECK_MESSAGE(parse_bool_text(no) == false, no);
  }
  for (const char* bad : {"", "2", "y", "n", "t", "enable", " 1", "1 ", "truee", "-1"}) {
    CHECK_MESSAGE(!parse_bool_text(bad).has_value(), '"' << bad << '"');
  }
}

TEST_CASE("integers: decimal with an optional K/M/G binary suffix") {
  using dtrain::detail::parse_int_text;
  const auto ok = [](const char* text, std::int64_t want) {
    const auto r = parse_int_text(text);
    CHECK_MESSAGE(r.status == ParseStatus::ok, text);
    CHECK_MESSAGE(r.value == want, text);
  };
  ok("0", 0);
  ok("42", 42);
  ok("007", 7);
  ok("-3", -3);
  ok("1K", 1024);
  ok("1k", 1024);
  ok("64M", 64LL << 20);
  ok("64m", 64LL << 20);
  ok("2G", 2LL << 30);
  ok("-2K", -2048);
  ok("9223372036854775807", std::numeric_limits<std::int64_t>::max());
  ok("-9223372036854775808", std::numeric_limits<std::int64_t>::min());
  ok("8589934591G", 8589934591LL << 30);

  for (const char* junk : {"", "-", "K", "abc", "12X", "1.5", "1e3", " 1", "1 ", "+1", "--1",
                           "1KK", "1KB", "1MiB", "0x10", "1_000", "١"}) {
    CHECK_MESSAGE(parse_int_text(junk).status == ParseStatus::not_a_number, '"' << junk << '"');
  }
  for (const char* big : {"9223372036854775808", "-9223372036854775809",
                          "99999999999999999999999", "8589934592G", "9007199254740992K"}) {
    CHECK_MESSAGE(parse_int_text(big).status == ParseStatus::out_of_range, big);
  }
}

TEST_CASE("counts a launcher writes: decimal digits only, read by name with the problem named") {
  using dtrain::detail::MapEnv;
  using dtrain::detail::parse_count_text;
  using dtrain::detail::read_env_count;
  CHECK(parse_count_text("0") == 0);
  CHECK(parse_count_text("007") == 7);
  CHECK(parse_count_text("999999999999999999") == 999999999999999999LL);
  for (const char* junk : {"", "-1", "+1", " 1", "1 ", "4K", "1.0", "0x1", "1234567890123456789"})
    CHECK_MESSAGE(!parse_count_text(junk).has_value(), '"' << junk << '"');

  std::int64_t value = 5;
  CHECK(read_env_count(MapEnv{}, "DTRAIN_ELASTIC_GENERATION", value).empty());
  CHECK(value == 5);  // unset: left alone
  CHECK(read_env_count(MapEnv{{"DTRAIN_ELASTIC_GENERATION", "12"}}, "DTRAIN_ELASTIC_GENERATION",
                       value).empty());
  CHECK(value == 12);
  CHECK(read_env_count(MapEnv{{"DTRAINRUN_RESTART_COUNT", "-2"}}, "DTRAINRUN_RESTART_COUNT",
                       value) == "DTRAINRUN_RESTART_COUNT='-2' is not a non-negative decimal number");
  CHECK(value == 12);
}

TEST_CASE("floats: finite decimals only") {
  using dtrain::detail::parse_float_text;
  const auto ok = [](const char* text, double want) {
    const auto r = parse_float_text(text);
    CHECK_MESSAGE(r.status == ParseStatus::ok, text);
    CHECK_MESSAGE(r.value == want, text);
  };
  ok("1", 1.0);
  ok("0.5", 0.5);
  ok(".25", 0.25);
  ok("2.", 2.0);
  ok("-1.5", -1.5);
  ok("1e3", 1000.0);
  ok("2.5E-3", 0.0025);
  ok("1e+2", 100.0);
  CHECK_FALSE(std::signbit(parse_float_text("-0").value));

  for (const char* junk : {"", "abc", "1,5", "1.5ms", " 1", "1 ", "+1", "0x1p3", "inf",
                           "-inf", "nan", "NaN", "infinity", ".", "e5", "1e", "--1", "1-2"}) {
    CHECK_MESSAGE(parse_float_text(junk).status == ParseStatus::not_a_number,
                  '"' << junk << '"');
  }
  CHECK(parse_float_text("1e400").status == ParseStatus::out_of_range);
  CHECK(parse_float_text("-1e400").status == ParseStatus::out_of_range);
}

TEST_CASE("typo distance counts one edit per slip, ignoring case") {
  using dtrain::detail::typo_distance;
  CHECK(typo_distance("DTRAIN_FUSION_THRESHOLD", "DTRAIN_FUSION_THRESHOLD") == 0);
  CHECK(typo_distance("DTRAIN_FUSION_TRESHOLD", "DTRAIN_FUSION_THRESHOLD") == 1);  // deletion
  CHECK(typo_distance("DTRAIN_CYCEL_TIME", "DTRAIN_CYCLE_TIME") == 1);           // swap
  CHECK(typo_distance("DTRAIN_CYCLE_TIMES", "DTRAIN_CYCLE_TIME") == 1);          // insertion
  CHECK(typo_distance("DTRAIN_CYCLE_TINE", "DTRAIN_CYCLE_TIME") == 1);           // substitution
  CHECK(typo_distance("dtrain_cycle_time", "DTRAIN_CYCLE_TIME") == 0);
  CHECK(typo_distance("", "abc") == 3);
  CHECK(typo_distance("abc", "") == 3);
  CHECK(typo_distance("kitten", "sitting") == 3);
}

TEST_CASE("lookup: DTRAIN_ wins over HOROVOD_, and a differing alias is reported") {
  using dtrain::detail::lookup_env;
  using dtrain::detail::MapEnv;
  {
    const MapEnv env{{"HOROVOD_CYCLE_TIME", "3"}};
    const auto found = lookup_env(env, "CYCLE_TIME");
    REQUIRE(found.chosen);
    CHECK(found.chosen->name == "HOROVOD_CYCLE_TIME");
    CHECK(found.chosen->value == "3");
    CHECK_FALSE(found.ignored_alias);
  }
  {
    const MapEnv env{{"HOROVOD_CYCLE_TIME", "3"}, {"DTRAIN_CYCLE_TIME", "2"}};
    const auto found = lookup_env(env, "CYCLE_TIME");
    REQUIRE(found.chosen);
    CHECK(found.chosen->name == "DTRAIN_CYCLE_TIME");
    CHECK(found.chosen->value == "2");
    REQUIRE(found.ignored_alias);
    CHECK(found.ignored_alias->name == "HOROVOD_CYCLE_TIME");
    CHECK(found.ignored_alias->value == "3");
  }
  {
    const MapEnv env{{"HOROVOD_CYCLE_TIME", "2"}, {"DTRAIN_CYCLE_TIME", "2"}};
    const auto found = lookup_env(env, "CYCLE_TIME");
    CHECK(found.chosen->name == "DTRAIN_CYCLE_TIME");
    CHECK_FALSE(found.ignored_alias);
  }
  {
    const MapEnv env{{"DTRAIN_CYCLE_TIME", ""}};  // set but empty is still set
    const auto found = lookup_env(env, "CYCLE_TIME");
    REQUIRE(found.chosen);
    CHECK(found.chosen->value.empty());
  }
  CHECK_FALSE(lookup_env(MapEnv{}, "CYCLE_TIME").chosen);
}

TEST_CASE("the process environment source sees real variables") {
  const dtrain::detail::ProcessEnv env;
  REQUIRE(::setenv("DTRAIN_ENV_SOURCE_TEST", "value=with=equals", 1) == 0);
  CHECK(env.get("DTRAIN_ENV_SOURCE_TEST") == "value=with=equals");
  const auto names = env.names();
  CHECK(std::find(names.begin(), names.end(), "DTRAIN_ENV_SOURCE_TEST") != names.end());
  REQUIRE(::unsetenv("DTRAIN_ENV_SOURCE_TEST") == 0);
  CHECK_FALSE(env.get("DTRAIN_ENV_SOURCE_TEST").has_value());
  const auto after = env.names();
  CHECK(std::find(after.begin(), after.end(), "DTRAIN_ENV_SOURCE_TEST") == after.end());
}
